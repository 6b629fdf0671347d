"""A real, throw-away PostgreSQL server for tests (the ``postgres_url`` fixture of tests/conftest.py).

``initdb`` makes a cluster in a fresh folder, ``pg_ctl start`` runs it on a unix socket only (no TCP port, so
parallel sessions never collide), ``createdb`` adds one database, and the caller gets its SQLAlchemy URL; the
server is stopped (``pg_ctl stop -m fast``) and its folder removed at the end, also when the body raised.
PostgreSQL refuses to run as root: as root, the binaries run as the ``postgres`` user (``runuser``) and the
cluster's folder is that user's; the test process connects over the socket as that database user.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SERVER_USER = "postgres"  # the account the server runs as when the tests run as root
DATABASE = "toolgraph"
_DEBIAN_BINS = Path("/usr/lib/postgresql")


def server_bin_dir() -> Path | None:
    """The folder of the server binaries (initdb, pg_ctl, createdb): initdb on PATH, else the newest
    /usr/lib/postgresql/<version>/bin (Debian's layout, which puts none of them on PATH)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(_DEBIAN_BINS.glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return versions[-1].parent if versions else None


def _as_root() -> bool:
    return os.geteuid() == 0


def unavailable() -> str | None:
    """Why no server can be started here (what to install), or None when one can."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed: pip install 'psycopg2-binary>=2.9,<3' (it is in the test extra)"
    bins = server_bin_dir()
    if bins is None:
        return (f"no PostgreSQL server binaries (initdb on PATH nor under {_DEBIAN_BINS}/*/bin): install the "
                "server, e.g. apt-get install postgresql (Debian/Ubuntu) or brew install postgresql@15 (macOS)")
    missing = [name for name in ("pg_ctl", "createdb") if not (bins / name).is_file()]
    if missing:
        return f"{bins} has initdb but not {', '.join(missing)}: install the full PostgreSQL server package"
    if _as_root():
        if shutil.which("runuser") is None:
            return "running as root, the PostgreSQL server needs another user, but runuser (util-linux) is missing"
        try:
            import pwd

            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (f"running as root, the PostgreSQL server runs as the user {SERVER_USER!r}, which does not exist: "
                    f"useradd --system {SERVER_USER} (Debian's postgresql package creates it)")
    return None


def _run(cmd: list[str], home: Path, log: Path | None = None, timeout: float = 120) -> None:
    """One server binary, as the server's user; a failure names the command, its output and the server log."""
    full = ["runuser", "-u", SERVER_USER, "--", *cmd] if _as_root() else cmd
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}  # no PGHOST/PGPORT of the caller's
    done = subprocess.run(full, cwd=home, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log is not None and log.is_file() else "(none)"
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}\n"
                           f"server log {log}:\n{tail}")


@contextmanager
def throwaway_postgres(tmp: Path) -> Iterator[str]:
    """Start a PostgreSQL server and yield ``postgresql+psycopg2://USER@/toolgraph?host=SOCKET_DIR``.

    The cluster and its socket live in a fresh folder under the system temp folder (short enough for a unix
    socket path, and reachable by the ``postgres`` user where pytest's own temp folders are root's only); it is
    removed at the end. The server log is copied to ``tmp/server.log`` for a look after a failure."""
    bins = server_bin_dir()
    if bins is None:
        raise RuntimeError(unavailable())
    home = Path(tempfile.mkdtemp(prefix="toolgraph-pg-"))
    data, sock, log = home / "data", home / "sock", home / "server.log"
    sock.mkdir()
    user = SERVER_USER if _as_root() else getpass.getuser()
    if _as_root():
        shutil.chown(home, SERVER_USER)
        shutil.chown(sock, SERVER_USER)
    try:
        # trust: only the socket's owner (and root) can reach the socket folder; fsync off: nothing here is kept
        _run([str(bins / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8", "--locale=C",
              "--no-sync"], home)
        _run([str(bins / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o",
              f"-k {sock} -h '' -c fsync=off -c synchronous_commit=off -c full_page_writes=off", "start"], home, log)
        _run([str(bins / "createdb"), "-h", str(sock), "-U", user, DATABASE], home, log)
        yield f"postgresql+psycopg2://{user}@/{DATABASE}?host={sock}"
    finally:
        try:
            if (data / "postmaster.pid").exists():
                _run([str(bins / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], home, log)
        finally:
            if log.is_file():
                shutil.copyfile(log, tmp / "server.log")
            shutil.rmtree(home, ignore_errors=True)
