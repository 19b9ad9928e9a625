"""Run a trainer script whose process nobody may ptrace or read /proc of.

PR_SET_DUMPABLE 0: attaching (py-spy) or reading /proc/PID/syscall, stack
and the like then needs CAP_SYS_PTRACE, which the conformance suite drops
from resilio (setpriv --bounding-set -sys_ptrace), as a site with
kernel.yama.ptrace_scope=2 or a hardened container would refuse it.

Usage: python _no_ptrace.py trainer.py [its arguments]
"""

import ctypes
import runpy
import sys

PR_SET_DUMPABLE = 4
if ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
    sys.exit("_no_ptrace.py: prctl(PR_SET_DUMPABLE, 0) failed")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
