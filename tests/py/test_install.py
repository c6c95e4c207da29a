"""`cmake --install` into a fresh prefix, then a small C program built against the installed
library the way an embedder builds one (`pkg-config --cflags --libs pshard`, and statically with
`--static`): it links, runs, prints the version and a status name, and opens the default model."""
import glob
import os
import shutil
import subprocess

import pytest

from conftest import BUILD

PROGRAM = r"""
#include <pshard.h>
#include <stdio.h>

int main(int argc, char **argv) {
    printf("pshard %s, status %s\n", PSHARD_VERSION, pshard_status_name(PSHARD_OK));
    if (argc < 2) return 0;
    pshard_params params;
    pshard_params_default(&params);
    params.model_path = argv[1];
    params.n_threads = 2;
    pshard_ctx *ctx = NULL;
    pshard_status st = pshard_open(&params, &ctx);
    if (st != PSHARD_OK) {
        printf("open: %s: %s\n", pshard_status_name(st), pshard_last_error());
        return 1;
    }
    pshard_info info;
    pshard_get_info(ctx, &info);
    printf("layers %d, vocabulary %d\n", info.n_layers, info.n_vocab);
    pshard_close(ctx);
    return 0;
}
"""


def run(*args, env=None):
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


@pytest.mark.skipif(not shutil.which("pkg-config") or not shutil.which("cc"), reason="needs pkg-config and cc")
def test_install_and_build_against_it(tmp_path, default_model):
    prefix = tmp_path / "prefix"
    run("cmake", "--install", BUILD, "--prefix", str(prefix))
    for tool in ("pshard", "gguf-synth"):
        assert os.access(prefix / "bin" / tool, os.X_OK), tool
    assert (prefix / "include" / "pshard.h").is_file()
    pc = glob.glob(str(prefix / "lib*" / "**" / "pkgconfig" / "pshard.pc"), recursive=True)
    assert len(pc) == 1, pc
    libdir = os.path.dirname(os.path.dirname(pc[0]))
    assert os.path.isfile(os.path.join(libdir, "libpshard.a"))
    assert run(str(prefix / "bin" / "pshard"), "--version").startswith("pshard ")

    env = {"PKG_CONFIG_PATH": os.path.dirname(pc[0])}
    flags = run("pkg-config", "--cflags", "--libs", "pshard", env=env).split()
    assert "-lpshard" in flags and any(f.startswith("-I") and f.endswith("include") for f in flags), flags
    version = run("pkg-config", "--modversion", "pshard", env=env).strip()
    source = tmp_path / "hello.c"
    source.write_text(PROGRAM)

    # The shared library where it was built (the default), else the static one.
    shared = os.path.exists(os.path.join(libdir, "libpshard.so"))
    program = str(tmp_path / "hello")
    run("cc", "-std=c11", str(source), "-o", program, *flags)
    out = run(program, default_model, env={"LD_LIBRARY_PATH": libdir})
    assert out.startswith("pshard %s, status ok\n" % version), out
    assert "layers 30, vocabulary 49152" in out, out
    if shared:
        assert os.path.join(libdir, "libpshard.so") in run("ldd", program, env={"LD_LIBRARY_PATH": libdir})

    # Statically: libpshard.a and what --static adds for it.
    static_flags = run("pkg-config", "--static", "--cflags", "--libs", "pshard", env=env).split()
    static_flags = [os.path.join(libdir, "libpshard.a") if f == "-lpshard" else f for f in static_flags]
    static = str(tmp_path / "hello-static")
    run("cc", "-std=c11", str(source), "-o", static, *static_flags)
    assert "libpshard" not in run("ldd", static)
    assert run(static).startswith("pshard %s, status ok\n" % version)
