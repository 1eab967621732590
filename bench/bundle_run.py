"""The runtime bundle's launcher (copied into the bundle as `run.py`; standard library only until the host is checked).

    python3 run.py [device-check] [ARGS]     the staged device check (bench/device_check.py), the default
    python3 run.py nextn ARGS                the nextn command line (run, bench) from the bundle
    python3 -I -S run.py ...                 the same with nothing from this interpreter's site-packages

Before importing anything the bundle carries, it compares this interpreter and machine with the bundle's
`bundle.json` ("host": the CPython version and ABI its compiled extensions were built for, the machine, the
oldest glibc its shared libraries accept) and checks that every package the bundle does not carry ("needs")
imports here. When they differ it prints one line saying what was expected and exits 2: a wrong `tvm_ffi`
extension would otherwise fail inside `dlopen` with a message that names neither. Then it puts the bundle's
`site/` first on sys.path, preloads the bundle's `libcudart` (TVM's CUDA plugin finds it by soname, so
LD_LIBRARY_PATH need not be set before the interpreter starts) and runs the command.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import platform
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
EXIT_HOST = 2


def this_host() -> dict:
    """This interpreter and machine, in the fields of bundle.json's "host"."""
    libc, ver = platform.libc_ver()
    return {"implementation": sys.implementation.name, "python": "%d.%d" % sys.version_info[:2],
            "soabi": sysconfig.get_config_var("SOABI") or "", "machine": platform.machine(),
            "glibc": ver if libc == "glibc" else ""}


def _version_tuple(v: str) -> tuple:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def host_mismatch(want: dict, have: dict) -> str | None:
    """What differs between the bundle's host `want` and this one `have`, as one phrase; None when they agree."""
    if have["implementation"] != want.get("implementation", "cpython"):
        return f"a {want.get('implementation', 'cpython')} interpreter, this is {have['implementation']}"
    if have["python"] != want["python"] or (want.get("soabi") and have["soabi"] != want["soabi"]):
        return f"Python {want['python']} ({want.get('soabi')}), this is Python {have['python']} ({have['soabi']})"
    if have["machine"] != want["machine"]:
        return f"a {want['machine']} machine, this is {have['machine']}"
    if want.get("glibc") and (not have["glibc"] or _version_tuple(have["glibc"]) < _version_tuple(want["glibc"])):
        return f"glibc >= {want['glibc']}, this has {have['glibc'] or 'no glibc'}"
    return None


def missing_needs(needs: dict) -> list[str]:
    """The packages of `needs` ({import name: pip requirement}) that do not import from sys.path."""
    return [req for mod, req in needs.items() if importlib.util.find_spec(mod) is None]


def check_host(bundle: dict, have: dict | None = None) -> str | None:
    """The one-line reason this bundle cannot run here, or None."""
    have = have or this_host()
    why = host_mismatch(bundle["host"], have)
    if why:
        return (f"this bundle was built for {why}: rebuild it for this host "
                f"(bash bench/make_gpu_bundle.sh --host here, run with this python3)")
    missing = missing_needs(bundle.get("needs", {}))
    if missing:
        return (f"this bundle needs {', '.join(missing)} from the host's {sys.executable}, which lacks "
                f"{'it' if len(missing) == 1 else 'them'}: install {'it' if len(missing) == 1 else 'them'} or rebuild "
                f"the bundle with --carry-all")
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    with open(os.path.join(HERE, "bundle.json")) as f:
        bundle = json.load(f)
    sys.path.insert(0, os.path.join(HERE, "site"))
    why = check_host(bundle)
    if why:
        print(f"nextn bundle: {why}", file=sys.stderr)
        return EXIT_HOST
    for lib in bundle.get("preload", []):          # libcudart for TVM's CUDA plugin (found by soname once loaded)
        try:
            ctypes.CDLL(os.path.join(HERE, lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:                        # no GPU runtime here: CPU mode still works, the check says so
            os.environ["NEXTN_BUNDLE_PRELOAD_ERROR"] = f"{lib}: {e}"
    os.environ["NEXTN_BUNDLE"] = HERE
    cmd = argv.pop(0) if argv and argv[0] in ("device-check", "nextn") else "device-check"
    if cmd == "nextn":
        from nextn.runtime.cli import main as nextn_main

        return nextn_main(argv) or 0
    sys.path.insert(1, HERE)                        # device_check.py sits beside run.py
    import device_check

    return device_check.main(argv)


if __name__ == "__main__":
    sys.exit(main())
