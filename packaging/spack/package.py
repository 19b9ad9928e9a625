# A Spack recipe for resilio (Spack 1.0 layout: the build systems live in
# spack_repo.builtin). Put it in a repo of your own as
# packages/resilio/package.py:
#
#   spack repo create /opt/spack-site site && mkdir -p /opt/spack-site/packages/resilio
#   cp packaging/spack/package.py /opt/spack-site/packages/resilio/
#   spack repo add /opt/spack-site && spack install resilio+spank
#
# Set `git` below to where your site mirrors resilio. The test suite checks
# this file without Spack (tests/packaging.sh: it parses, the class is
# Resilio, its newest version is Cargo.toml's); it does not run Spack.

from spack_repo.builtin.build_systems.cargo import CargoPackage

from spack.package import *


class Resilio(CargoPackage):
    """A Slurm-integrated resilient job supervisor for ML training runs: put
    `resilio run --` in front of a training command and it detects hangs,
    gathers evidence, journals every attempt and, under Slurm, relaunches or
    requeues the job without the failing node."""

    homepage = "https://example.invalid/resilio"
    git = "https://example.invalid/resilio.git"

    license("Apache-2.0")

    version("main", branch="main")
    version("0.1.0", tag="v0.1.0")

    variant(
        "spank",
        default=False,
        description="Build the SPANK plugin (srun --resilio) against Slurm's spank.h",
    )

    depends_on("rust@1.88:", type="build")
    depends_on("c", type="build", when="+spank")
    depends_on("gmake", type="build", when="+spank")
    depends_on("slurm", when="+spank")

    @property
    def build_args(self):
        # cargo install --root out --path . (CargoBuilder.build) with the lock file.
        return ["--locked"]

    @run_after("install")
    def install_plugin(self):
        if not self.spec.satisfies("+spank"):
            return
        # <slurm/spank.h> is found through Spack's compiler wrapper, which
        # adds each dependency's include directory (slurm's here). Passing
        # CFLAGS on make's command line would replace the Makefile's -fPIC.
        with working_dir(join_path(self.stage.source_path, "slurm-plugin")):
            make("resilio_spank.so")
            make("install", "LIBDIR={0}".format(self.prefix.lib.resilio))

    @run_after("install")
    def install_docs_and_config(self):
        # A copy of every key with its default; resilio itself reads
        # /etc/resilio/resilio.toml or $RESILIO_SYSTEM_CONFIG.
        conf = join_path(self.stage.source_path, "conf")
        mkdirp(self.prefix.etc.resilio)
        install(join_path(conf, "resilio.toml"), self.prefix.etc.resilio)
        mkdirp(self.prefix.share.resilio)
        install(join_path(conf, "prometheus.yml"), self.prefix.share.resilio)
        install(join_path(conf, "grafana-dashboard.json"), self.prefix.share.resilio)

    @run_after("install")
    def install_man_pages_and_completions(self):
        resilio = Executable(self.prefix.bin.resilio)

        mkdirp(self.prefix.share.man.man1)
        resilio("man", "--dir", self.prefix.share.man.man1)

        mkdirp(bash_completion_path(self.prefix))
        with open(bash_completion_path(self.prefix) / "resilio", "w") as f:
            resilio("completions", "bash", output=f)

        mkdirp(zsh_completion_path(self.prefix))
        with open(zsh_completion_path(self.prefix) / "_resilio", "w") as f:
            resilio("completions", "zsh", output=f)

        mkdirp(fish_completion_path(self.prefix))
        with open(fish_completion_path(self.prefix) / "resilio.fish", "w") as f:
            resilio("completions", "fish", output=f)
