fn main() {
    std::process::exit(resilio::cli::main());
}
