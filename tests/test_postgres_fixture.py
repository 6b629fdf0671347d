"""The postgres_url fixture is a real PostgreSQL server (tests/postgres.py): SQL runs on it, Optuna's RDBStorage
keeps a study there that separate storage objects share, and the server stops when its context ends."""

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest


def test_the_url_reaches_a_real_postgresql_server_on_a_unix_socket_only(postgres_url):
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            version = conn.execute(sqlalchemy.text("SELECT version()")).scalar_one()
            listen = conn.execute(sqlalchemy.text("SHOW listen_addresses")).scalar_one()
            assert conn.execute(sqlalchemy.text("SELECT 6 * 7")).scalar_one() == 42
    finally:
        engine.dispose()
    assert version.startswith("PostgreSQL "), version
    assert listen == "", f"the test server listens on TCP ({listen!r}); it should use its unix socket only"


def test_an_optuna_study_is_shared_by_separate_storages(postgres_url):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storages = [optuna.storages.RDBStorage(postgres_url) for _ in range(3)]  # one engine each, like 3 workers
    try:
        optuna.create_study(study_name="fixture-shared", storage=storages[0], direction="maximize")
        for value, storage in [(0.25, storages[1]), (0.75, storages[2])]:
            worker = optuna.load_study(study_name="fixture-shared", storage=storage)
            trial = worker.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)})
            worker.tell(trial, value)
        back = optuna.load_study(study_name="fixture-shared", storage=storages[0])
        assert sorted(t.value for t in back.trials) == [0.25, 0.75]
        assert {t.state for t in back.trials} == {optuna.trial.TrialState.COMPLETE}
        assert sorted(t.number for t in back.trials) == [0, 1]
        assert back.best_value == 0.75 and 1e-4 <= back.best_params["lr"] <= 1e-1
    finally:
        for storage in storages:
            storage.engine.dispose()


def test_the_server_stops_and_its_folder_goes_when_the_body_raises(tmp_path):
    from postgres import throwaway_postgres, unavailable

    if unavailable():
        pytest.skip(unavailable())
    class BodyFailed(Exception):
        pass

    with pytest.raises(BodyFailed):
        with throwaway_postgres(tmp_path) as url:
            sock = Path(parse_qs(urlsplit(url).query)["host"][0])
            assert (sock / ".s.PGSQL.5432").exists()
            raise BodyFailed
    assert not sock.parent.exists(), f"{sock.parent} is left behind"
    assert "database system is shut down" in (tmp_path / "server.log").read_text()


def test_without_server_binaries_the_reason_says_what_to_install(tmp_path, monkeypatch):
    import postgres

    pytest.importorskip("psycopg2")
    monkeypatch.setenv("PATH", str(tmp_path))  # no initdb on PATH
    monkeypatch.setattr(postgres, "_DEBIAN_BINS", tmp_path / "no-postgresql")
    assert postgres.server_bin_dir() is None
    assert "apt-get install postgresql" in postgres.unavailable()
    (tmp_path / "initdb").write_text("#!/bin/sh\n")
    (tmp_path / "initdb").chmod(0o755)
    assert postgres.server_bin_dir() == tmp_path.resolve()
    assert "not pg_ctl, createdb" in postgres.unavailable()
