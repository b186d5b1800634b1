"""shmdist: torch.distributed-style messaging over shared memory on one host.

`import shmdist.torch` registers the torch.distributed backend "shm":

    import torch.distributed as dist
    import shmdist.torch
    dist.init_process_group(backend="shm")

The exceptions shmdist raises are RuntimeError subclasses, importable from here once the
extension is loaded (after `import shmdist.torch`): Error, InvalidArgument, Timeout,
PeerFailure, SetupError, NotInitialized.
"""

__all__ = ["Error", "InvalidArgument", "Timeout", "PeerFailure", "SetupError", "NotInitialized"]


def __getattr__(name):
    # The extension needs torch loaded first; shmdist.torch does that.
    if name in __all__:
        from . import torch as _torch  # noqa: F401  (imports torch, then the extension)
        from . import _C
        return getattr(_C, name)
    raise AttributeError(f"module 'shmdist' has no attribute {name!r}")
