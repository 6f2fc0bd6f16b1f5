"""The embedded journal's files, private to the user that runs PAL: folders 0700, files 0600.

PAL is a library inside other people's processes, so it never touches the umask: it creates each
folder and the database file itself, with those modes, before SQLite opens the file. SQLite gives
the -wal, -shm and -journal files it creates the database file's own mode (its unix VFS), so they
are 0600 too (docs/security.md, "The database and the broker").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")  # the files SQLite keeps beside a database


def private_folder(path: Path) -> None:
    """Create `path` and every missing parent as 0700. A folder that exists already is the
    operator's (a project folder, /tmp) and keeps its mode."""
    missing: list[Path] = []
    current = path.absolute()
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_FOLDER)
        except FileExistsError:
            continue  # another process made it first, with this same mode
        os.chmod(folder, PRIVATE_FOLDER)  # exactly 0700: mkdir's mode went through the umask


def private_database_file(path: Path) -> None:
    """Create the SQLite database `path` empty as 0600 unless it exists (SQLite reads an empty file
    as an empty database). An existing one, and its -wal, -shm and -journal files, lose any group
    and other permission bits when this user owns them."""
    private_folder(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, PRIVATE_FILE)  # exactly 0600: a umask of 0277 would leave it unwritable
        finally:
            os.close(fd)
    for name in (path, *(path.with_name(path.name + suffix) for suffix in SQLITE_COMPANIONS)):
        try:
            info = os.stat(name)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid == os.geteuid() and mode & 0o077:
            os.chmod(name, mode & ~0o077)
