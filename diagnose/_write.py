"""Every file diagnose writes goes through here: output-path guards and one atomic write.

atomic_write: the content goes to a uniquely named temporary file in the target's folder,
is fsynced, renamed over the target (os.replace), and the folder is fsynced, so a reader
sees the old file or the new one, never half of one. When the write fails (read-only
folder, name too long, disk full, ...) the temporary file is removed, the error is one line
naming the path and a fix, and -- unless the caller says the content is disposable -- the
content is saved in the system's temporary folder first, so that minutes of computation are
not lost to a typo in an output path; the message names that file.

check_output: refuse a path that would destroy something: one of the command's inputs, a
file inside an input folder (a run folder, a model folder), anything that exists and is not
a regular file (a device, a FIFO, a folder), or a read-only file.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Union

from .errors import OutputError

Content = Union[str, bytes, Callable[[BinaryIO], None]]


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def _resolved(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.realpath(os.fspath(path))))


def check_output(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = (),
                 option: str = "output", folder: bool = False) -> Path:
    """Raise OutputError unless writing `path` is safe; returns it as a Path.

    inputs: the files and folders the command reads. option: how the user named the path
    (e.g. "--json"), for the message. folder: the output is a folder new files go into (it
    may exist as a folder, must not be or lie in an input folder).
    """
    path = Path(path)
    target = _resolved(path)
    for src in inputs:
        if src is None:
            continue
        src_path = Path(src)
        if not src_path.exists():
            continue
        same = target == _resolved(src_path)
        try:
            same = same or (path.exists() and os.path.samefile(path, src_path))
        except OSError:
            pass
        if same:
            raise OutputError(f"{path}: {option} names an input of this command ({src}); writing it would "
                              "destroy the input: choose another output path")
        if src_path.is_dir() and _resolved(src_path) in target.parents:
            raise OutputError(f"{path}: {option} is inside the input folder {src}; writing there could "
                              "overwrite part of it: choose a path outside that folder")
    if folder and os.path.islink(path) and not os.path.exists(path):  # making that folder would fail after the work
        raise OutputError(f"{path}: {option} is a symbolic link to nothing; give the real folder path, or a new one")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        _check_parent(path, option)
        return path
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the {option} there ({_reason(exc)}); {_fix(exc)}") from None
    kind = _kind(st.st_mode)
    if folder:
        if kind != "a folder":
            raise OutputError(f"{path}: {option} must be a folder, but it is {kind or 'a file'}; "
                              "give a folder path (it is created if missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise OutputError(f"{path}: {option} is a folder you cannot write to; choose a folder you can write to")
        return path
    if kind is not None:
        raise OutputError(f"{path}: {option} is {kind}, not a regular file; give a file path "
                          f"(to skip this output, leave out {option})" if option.startswith("-")
                          else f"{path}: is {kind}, not a regular file; give a file path")
    # the mode bits, not only os.access: root may write anything, yet a chmod 444 file says "keep"
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        raise OutputError(f"{path}: {option} exists and is read-only; choose another path, or make it "
                          f"writable (chmod u+w {path}) if it may be replaced")
    _check_parent(path, option)
    return path


def _check_parent(path: Path, option: str) -> None:
    """The nearest folder above a new output must be one this process may create files in
    (checked before any work; root passes os.access, and the write's own fallback covers that)."""
    parent = Path(os.path.abspath(path)).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.is_dir() and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: cannot write the {option} there ({parent} is read-only for you); "
                          "choose a folder you can write to")


def check_outputs(outputs: dict[str, str | os.PathLike | None], *,
                  inputs: Iterable[str | os.PathLike | None] = (), folders: Iterable[str] = ()) -> None:
    """check_output for each {option: path} a command will write (None: not asked for), and no
    two of them the same file. Commands call this before any work, so a bad path costs nothing.
    folders: the options whose path is a folder to write into (--tensorboard, --out)."""
    given = {opt: p for opt, p in outputs.items() if p is not None}
    folders = set(folders)
    seen: dict[Path, str] = {}
    for opt, p in given.items():
        check_output(p, inputs=list(inputs), option=opt, folder=opt in folders)
        key = _resolved(p)
        if key in seen:
            raise OutputError(f"{p}: {seen[key]} and {opt} name the same file; give each its own path")
        seen[key] = opt


def atomic_write(path: str | os.PathLike, content: Content, *, keep_on_failure: bool = True,
                 what: str = "output") -> Path:
    """Write `content` (text, bytes, or a function writing to a binary file) to `path` atomically.

    Raises OutputError (one line) when it cannot; with keep_on_failure the content is first
    saved in the temporary folder and the message says where.
    """
    path = Path(path)
    check_output(path, option=what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_replace(path, content)
    except OSError as exc:
        saved = _fallback(path, content) if keep_on_failure else None
        kept = (f"; the {what} was saved to {saved} instead" if saved else
                f"; it could not be saved in {tempfile.gettempdir()} either" if keep_on_failure else "")
        raise write_error(path, what, exc, kept) from None
    return path


def write_error(path: str | os.PathLike, what: str, exc: OSError, kept: str = "") -> OutputError:
    """The one-line OutputError for an output that could not be written: the path, what it was, the
    system's reason, `kept` (where the content went instead, "; ..."), and what to do about it.
    atomic_write raises it; a writer of a whole folder (prune's model) raises the same."""
    return OutputError(f"{path}: cannot write the {what} ({_reason(exc)}){kept}; {_fix(exc)}")


def replace_atomically(path: str | os.PathLike, content: Content) -> None:
    """The atomic writer's core: `content` goes to a temporary file beside `path`, fsynced, renamed
    over it; an OSError comes through as it is. For a writer that stages a whole folder and turns
    an OSError into its own message (prune's model folder); every other write uses atomic_write,
    which adds the output checks and the one-line OutputError."""
    _write_replace(Path(path), content)


def _write_replace(path: Path, content: Content) -> None:
    # a short prefix: the target's own name may already be near the 255-byte limit
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            _fill(f, content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~process_umask())  # mkstemp makes it private; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _fill(f: BinaryIO, content: Content) -> None:
    if isinstance(content, str):
        f.write(content.encode("utf-8"))
    elif isinstance(content, bytes):
        f.write(content)
    else:
        content(f)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable; some filesystems cannot open a folder: nothing lost then."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def process_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask(0) would briefly
    let other threads create world-writable files). A writer that makes a private temporary file or
    folder (mkstemp, mkdtemp) and renames it into place gives it the permissions the umask allows,
    as open() and mkdir() would have."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fallback(path: Path, content: Content) -> Path | None:
    """Save the content in the temporary folder; None when that fails too."""
    suffix = "".join(path.suffixes)[-16:]
    try:
        fd, tmp = tempfile.mkstemp(prefix="diagnose-", suffix=suffix)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            _fill(f, content)
            f.flush()
            os.fsync(f.fileno())
    except Exception:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return Path(tmp)


def _reason(exc: OSError) -> str:
    if exc.errno is not None and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _fix(exc: OSError) -> str:
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "free some space on that disk or write somewhere else"
    if code == errno.ENAMETOOLONG:
        return "use a shorter file name"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "choose a folder you can write to"
    if code in (errno.ENOTDIR, errno.EEXIST):
        return "part of the path is a file, not a folder: choose another path"
    return "choose another path"
