"""Builds (once) and loads the C++ extension with torch.utils.cpp_extension against the installed
torch. The build goes to COLLX_TORCH_BUILD_DIR, else build-torch/ beside python/ when that is
writable (a checkout), else torch's extension cache; ninja rebuilds only what changed."""
import glob
import os

import contextlib
import io

with contextlib.redirect_stderr(io.StringIO()):  # its "No CUDA runtime is found" on CPU-only hosts
    from torch.utils import cpp_extension

_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(os.path.dirname(_here))
_include = os.path.join(_root, "include")


def build_directory():
    d = os.environ.get("COLLX_TORCH_BUILD_DIR")
    if not d and os.access(_root, os.W_OK):
        d = os.path.join(_root, "build-torch")
    if d:
        os.makedirs(d, exist_ok=True)
    return d


def load(verbose=None):
    # A process started by one that has loaded it (torch's spawned test ranks) takes the same
    # build as it is, without asking ninja again.
    prebuilt = os.environ.get("COLLX_TORCH_EXT_PATH")
    if prebuilt and os.path.exists(prebuilt):
        import importlib.machinery
        import importlib.util
        loader = importlib.machinery.ExtensionFileLoader("collx_torch_ext", prebuilt)
        spec = importlib.util.spec_from_file_location("collx_torch_ext", prebuilt, loader=loader)
        m = importlib.util.module_from_spec(spec)
        loader.exec_module(m)
        return m
    if verbose is None:
        verbose = os.environ.get("COLLX_TORCH_VERBOSE_BUILD", "") not in ("", "0")
    sources = sorted(glob.glob(os.path.join(_here, "csrc", "*.cpp")))
    m = cpp_extension.load(
        name="collx_torch_ext",
        sources=sources,
        extra_include_paths=[_include],
        extra_cflags=["-std=c++20", "-O2", "-Wno-deprecated-declarations"],
        # transport::tcp's admission (HMAC-SHA-256) and TLS: OpenSSL (libssl-dev)
        extra_ldflags=["-lssl", "-lcrypto"],
        build_directory=build_directory(),
        verbose=verbose,
    )
    os.environ["COLLX_TORCH_EXT_PATH"] = m.__file__
    return m


if __name__ == "__main__":
    m = load(verbose=True)
    print("collx_torch: built", m.__file__)
