"""Settings: env AGG_*, config file, overrides, and errors that name the variable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aggregator.service.settings import SettingsError, load_settings
from aggregator.web.app import create_app


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("AGG_"):
            monkeypatch.delenv(key)


def test_env_transports_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGG_D", "10")
    monkeypatch.setenv("AGG_TRANSPORTS", "zmq+tcp://127.0.0.1:5555, mqtt://127.0.0.1:1883")
    s = load_settings()
    assert s.transports == ["zmq+tcp://127.0.0.1:5555", "mqtt://127.0.0.1:1883"]


def test_overrides_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGG_D", "10")
    assert load_settings(d=5).d == 5


def test_json_config_file_is_read_and_env_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "agg.json"
    cfg.write_text(json.dumps({"d": 7, "job": "fromfile", "AGG_MAX_ROUNDS": 3}))
    monkeypatch.setenv("AGG_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AGG_JOB", "fromenv")
    s = load_settings()
    assert (s.d, s.job, s.max_rounds) == (7, "fromenv", 3)


def test_dotenv_config_file_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "agg.env"
    cfg.write_text("AGG_D=12\nAGG_MODE=async\nAGG_TRANSPORTS=memory://x,memory://y\n")
    monkeypatch.setenv("AGG_CONFIG_FILE", str(cfg))
    s = load_settings()
    assert (s.d, s.mode, s.transports) == (12, "async", ["memory://x", "memory://y"])


def test_unknown_key_in_config_file_is_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "agg.json"
    cfg.write_text(json.dumps({"d": 7, "roundz": 3}))
    monkeypatch.setenv("AGG_CONFIG_FILE", str(cfg))
    with pytest.raises(SettingsError, match="unknown setting 'roundz'"):
        load_settings()


def test_bad_value_error_names_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGG_D", "10")
    monkeypatch.setenv("AGG_ROUND_DEADLINE_S", "-1")
    with pytest.raises(SettingsError, match="AGG_ROUND_DEADLINE_S"):
        load_settings()


def test_missing_d_is_reported() -> None:
    with pytest.raises(SettingsError, match="AGG_D: is required"):
        load_settings()


def test_bad_transport_url_is_reported() -> None:
    with pytest.raises(SettingsError, match="AGG_TRANSPORTS"):
        load_settings(d=3, transports="nonsense")


def test_no_token_by_default() -> None:
    assert load_settings(d=3).token is None


def test_token_file_is_read_once(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("a-long-enough-secret-token\n")
    s = load_settings(d=3, api_token_file=f)
    f.write_text("changed-afterwards-changed-afterwards")
    assert s.token == "a-long-enough-secret-token"


def test_short_token_is_refused() -> None:
    with pytest.raises(SettingsError, match="at least 16"):
        load_settings(d=3, api_token="short")


def test_mqtt_options_go_to_mqtt_urls_only(tmp_path: Path) -> None:
    s = load_settings(
        d=3,
        mqtt_username="agg",
        mqtt_password_file=tmp_path / "pw",
        mqtt_ca_file=tmp_path / "ca.pem",
    )
    assert s.transport_options("mqtts://broker:8883") == {
        "username": "agg",
        "password_file": str(tmp_path / "pw"),
        "ca_file": str(tmp_path / "ca.pem"),
    }
    zmq_options = s.transport_options("zmq+tcp://127.0.0.1:5555")  # cap and queues only
    assert set(zmq_options) == {"max_message_bytes", "sndhwm", "rcvhwm"}


def test_settings_are_frozen() -> None:
    s = load_settings(d=3)
    with pytest.raises(ValueError, match="frozen"):
        s.d = 4


def test_create_app_reads_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGG_D", "not a number")
    create_app()  # settings are read when the lifespan starts, not here


def test_periodic_snapshots_are_retained_only_over_mqtt_and_never_in_minibatch_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGG_D", "10")
    # ZeroMQ (the default transport) retains nothing: no periodic snapshot unless asked
    assert load_settings().engine_config().snapshot_every == 0
    monkeypatch.setenv("AGG_TRANSPORTS", "zmq+tcp://127.0.0.1:5555,mqtt://127.0.0.1:1883")
    assert load_settings().engine_config().snapshot_every == 50
    monkeypatch.setenv("AGG_BATCH_SIZE", "0.1")
    assert load_settings().engine_config().snapshot_every == 0
    monkeypatch.setenv("AGG_SNAPSHOT_EVERY", "20")
    assert load_settings().engine_config().snapshot_every == 20
    monkeypatch.delenv("AGG_BATCH_SIZE")
    monkeypatch.setenv("AGG_SNAPSHOT_EVERY", "0")
    assert load_settings().engine_config().snapshot_every == 0


def test_a_minibatch_local_job_carries_its_batch_into_local_training(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGG_D", "10")
    monkeypatch.setenv("AGG_LOCAL_STEPS", "20")
    monkeypatch.setenv("AGG_BATCH_SIZE", "0.1")
    cfg = load_settings().engine_config()
    assert cfg.batch_size == 0.1 and cfg.local is not None and cfg.local.batch_size == 0.1
    assert cfg.schedule_l2 is None


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"AGG_LOCAL_STEPS": "15", "AGG_BATCH_SIZE": "0.1"}, "multiple of 10"),
        ({"AGG_LOCAL_STEPS": "20", "AGG_BATCH_SIZE": "64"}, "fraction"),
        ({"AGG_LOCAL_STEPS": "20", "AGG_BATCH_SIZE": "0.1", "AGG_SCHEDULE_L2": "1e-3"},
         "AGG_SCHEDULE_L2"),
        # a drawn schedule: one of the two, no minibatch, a probability
        ({"AGG_COMM_PROB": "0.2", "AGG_LOCAL_STEPS": "5"}, "set one"),
        ({"AGG_COMM_PROB": "0.1", "AGG_BATCH_SIZE": "0.1"}, "AGG_COMM_PROB with AGG_BATCH_SIZE"),
        ({"AGG_COMM_PROB": "1.5"}, "AGG_COMM_PROB: Input should be less than or equal to 1"),
        ({"AGG_COMM_PROB": "0.2", "AGG_FEEDBACK": "ef21"}, "AGG_COMM_PROB runs local training"),
    ],
)  # fmt: skip
def test_a_local_job_that_would_stall_or_cannot_run_is_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], needle: str
) -> None:
    monkeypatch.setenv("AGG_D", "10")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=needle):
        load_settings()


def test_a_drawn_schedule_runs_local_training_with_its_probability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``AGG_COMM_PROB`` alone makes a local-training job: feedback local, the default
    step min(1, 2p)/L, no periodic snapshot, and the job message names the probability."""
    monkeypatch.setenv("AGG_D", "10")
    monkeypatch.setenv("AGG_COMM_PROB", "0.2")
    cfg = load_settings().engine_config()
    assert cfg.feedback == "local" and cfg.local is not None
    assert cfg.local.comm_prob == 0.2 and cfg.local.schedule == (None, 0.2)
    assert cfg.local.factor == pytest.approx(0.4)
    assert cfg.snapshot_every == 0
