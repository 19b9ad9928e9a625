fn main() {
    // Before resilio starts any process: what is already a child (a
    // `>(...)` reader bash forked) is not resilio's to stop or wait for.
    resilio::process::note_inherited_children();
    std::process::exit(resilio::cli::main());
}
