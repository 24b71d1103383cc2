"""This user's secret key and what it vouches for: the MACs that prove a cache entry (a compiled library, a cached
plan) was written by this user's kernorch, and the private directories such caches live in.

The key is kept outside every cache (`~/.config/kernorch/library.key`, 0600; `KERNORCH_KEY_FILE` overrides), so
whoever can write a cache (a shared KERNORCH_CACHE, a restored CI cache) still cannot sign what they put there.
A leaf module: it imports no stage, so every stage may use it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import tempfile
import warnings
from functools import cache
from pathlib import Path

from kernorch.errors import KernorchError
from kernorch.options import writable_dir

KEY_ENV = "KERNORCH_KEY_FILE"
KEY_BYTES = 32


def key_path() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "kernorch" / "library.key"


def _private_file(path: Path) -> bool:
    """A regular file owned by this user that nobody else can read or write."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


@cache
def signing_key() -> bytes:
    """This user's secret for cache MACs (compiled libraries, cached plans): read from key_path(), created there
    (atomically, 0600) on first use. Where it cannot be kept (no writable home, a key file others can read or
    write), a key for this process alone: entries written by other processes are then rebuilt instead of read."""
    path = key_path()
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".library.key.")  # 0600
            with os.fdopen(fd, "wb") as file:
                file.write(os.urandom(KEY_BYTES))
            try:
                os.link(temporary, path)  # atomic and never overwrites: a concurrent creator's key wins
            finally:
                os.unlink(temporary)
        except FileExistsError:
            pass
        except OSError:
            return os.urandom(KEY_BYTES)
    if _private_file(path):
        key = path.read_bytes()
        if len(key) == KEY_BYTES:
            return key
    warnings.warn(f"kernorch: {path} is not a {KEY_BYTES}-byte file private to this user; compiled kernels are "
                  "signed with a key of this process only (and rebuilt by every process)", stacklevel=2)  # fmt: skip
    return os.urandom(KEY_BYTES)


def sign(purpose: str, *parts: bytes) -> str:
    """HMAC-SHA256 under this user's key of `parts` for `purpose` (a library, a cached plan): what proves that
    this user's kernorch wrote a cache entry. The purpose keeps one kind's MAC from vouching for another."""
    return hmac.new(signing_key(), b"\0".join([purpose.encode(), *parts]), hashlib.sha256).hexdigest()


def signed(recorded: str, purpose: str, *parts: bytes) -> bool:
    return hmac.compare_digest(recorded, sign(purpose, *parts))


class UntrustedCache(KernorchError):
    """The compile cache's directory can be changed by other users: nothing is loaded from it."""


def private_dir(directory: Path, purpose: str = "compiled kernels") -> Path:
    """`directory`, created 0700 if missing; refused when someone other than this user owns it or may write it."""
    writable_dir(directory.parent, purpose)
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        info = directory.lstat()
    except OSError as error:
        raise KernorchError(f"cannot create the cache directory {directory} for {purpose}: "
                            f"{error.strerror or error} (set KERNORCH_CACHE to a writable directory)") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise UntrustedCache(f"the cache {directory} can be changed by other users (owner uid {info.st_uid}, "
                             f"mode {stat.filemode(info.st_mode)}): kernorch loads {purpose} only from a directory "
                             "private to you (chmod 700 it, or set KERNORCH_CACHE)")
    return directory
