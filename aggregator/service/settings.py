"""Aggregator settings: environment variables ``AGG_*``, an optional config file, CLI flags.

Precedence (highest first): explicit values (``aggregator serve`` flags, or keyword
arguments in code), environment variables ``AGG_<FIELD>``, the file named by
``AGG_CONFIG_FILE`` (a ``.json`` object keyed by field name, or a ``.env`` file of
``AGG_<FIELD>=value`` lines), defaults.

Settings are read *once* by :func:`load_settings` (the app's lifespan or the CLI) and
passed down; nothing reads the environment at import time. Errors name the environment
variable and the fix.

List values (``AGG_TRANSPORTS``) are comma-separated in the environment:
``AGG_TRANSPORTS=zmq+tcp://0.0.0.0:5555,mqtt://127.0.0.1:1883`` runs ZeroMQ and MQTT at once.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from dotenv import dotenv_values
from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from aggregator.engine.admission import MAX_PAYLOAD_BYTES, Limits, MacPolicy
from aggregator.engine.downlink.broadcast import DownlinkMode
from aggregator.engine.robust_round import parse_aggregation
from aggregator.engine.rounds import EngineConfig
from aggregator.service.errors import SettingsError
from aggregator.service.profiles import profile_problem
from edge_agent.errors import CatEdgeError
from edge_agent.numerics.local import DEFAULT_CHI, DEFAULT_RHO, LocalConfig, check_passes
from edge_agent.protocol import topics
from edge_agent.protocol.mac import MacKeyError, read_keys_dir
from edge_agent.protocol.signing import CountingSigner, SigningKeyError, read_secret_key
from edge_agent.transports import parse_url

#: SettingsError is the settings' error; it lives in errors.py so profiles.py can raise it
__all__ = ["Settings", "SettingsError", "env_name", "load_settings"]

ENV_PREFIX = "AGG_"
CONFIG_FILE_ENV = "AGG_CONFIG_FILE"
MQTT_SCHEMES = ("mqtt", "mqtts")


def env_name(field: str) -> str:
    """``round_deadline_s`` -> ``AGG_ROUND_DEADLINE_S``."""
    return f"{ENV_PREFIX}{field.upper()}"


class Settings(BaseSettings):
    """Everything the aggregator service is configured with (env ``AGG_<FIELD>``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        case_sensitive=False,
        validate_default=True,
    )

    config_file: Path | None = Field(
        None, description="JSON or .env file with more settings (env and flags win)."
    )
    # --- the job
    job: str = Field("cat", description="Job id: topics live under cat/<job>/.")
    model: Literal["logreg", "lsq", "softmax"] = Field("logreg", description="Model kind.")
    d: int = Field(gt=0, description="Number of model parameters (required).")
    n_classes: int = Field(2, ge=2, description="Classes (softmax only).")
    l2: float = Field(1e-3, ge=0, description="l2 regularisation of the evaluation model.")
    step_size: float | None = Field(
        None, gt=0, description="Step gamma; unset: 1/L from the agents' hellos."
    )
    # --- rounds
    mode: Literal["sync", "async"] = "sync"
    max_rounds: int | None = Field(None, ge=1, description="Stop at this model version.")
    target_loss: float | None = Field(None, description="Stop when the eval loss <= this.")
    loss_floor: Annotated[float, Field(allow_inf_nan=False)] | Literal["auto", "none"] = Field(
        "auto", description="Least the eval loss can be (ETA): a number, auto (solved), none."
    )
    quorum_min_agents: int = Field(1, ge=1)
    quorum_fraction: float = Field(0.5, ge=0.0, le=1.0)
    min_agents: int = Field(1, ge=1, description="Hellos needed before round 0 may close.")
    round_deadline_s: float = Field(30.0, gt=0, description="Seconds before quorum suffices.")
    async_apply_every: int = Field(1, ge=1, description="Async: step every K updates.")
    max_staleness: int = Field(4, ge=0, description="Async: oldest accepted version lag.")
    dedupe_window: int = Field(1024, ge=1, description="Versions (agent, round, seq) are kept.")
    liveness_timeout_s: float = Field(60.0, gt=0, description="Silent agents count as dead.")
    tick_s: float = Field(0.1, gt=0, le=5.0, description="Deadline/liveness check period.")
    ef21_step_factor: float = Field(
        0.5, gt=0, le=1, description="EF21 jobs: step = factor / L unless step_size is set."
    )
    downlink: DownlinkMode = Field(
        "auto",
        description="How agents follow the model: auto (per version, the exact relay or the "
        "compressed change, whichever reduces what the copies miss the most per unit of the "
        "fleet's receiving cost), exact replicated steps, float64 deltas, or cat: a "
        "compressed broadcast with error feedback (docs/algorithm.md).",
    )
    downlink_pacing: bool = Field(
        True,
        description="Space versions so no agent receives more downlinks than its profile "
        "allows (daily cap, sender duty cycle); off only for loopback demos and tests.",
    )
    max_hold_s: float = Field(
        900.0,
        gt=0,
        description="With downlink pacing: a round that could close waits at most this many "
        "seconds for busy downlinks (a LoRaWAN daily cap can hold it for hours), then closes "
        "without the agents whose links hold it; they catch up when their links are free.",
    )
    snapshot_every: int | None = Field(
        None,
        ge=0,
        description="Also retain a full snapshot every N versions (0: start/request only). "
        "Unset: 50 with an MQTT transport, else 0 (ZeroMQ retains nothing, so every agent "
        "would only receive the model again); 0 in a minibatch job (AGG_BATCH_SIZE), whose "
        "hundreds of versions would make the snapshots outweigh the compressed traffic, "
        "and in a local-training job.",
    )
    # --- what agents may claim (aggregator.engine.admission.Limits, docs/operating.md)
    step_rule: Literal["mean", "median"] = Field(
        "mean",
        description="How L is formed from the hellos' L_i (no step_size): the row-weighted "
        "mean (every claim trusted), or a median one lying agent cannot move.",
    )
    aggregation: str = Field(
        "mean",
        description="How a round's updates are combined: mean, clipped_mean[:c] (each update "
        "clipped to c times the round's median norm, c = 2) or trimmed_mean[:fraction] "
        "(coordinate-wise, 0.1 per side); robust rules broadcast delta for exact (not EF21).",
    )
    max_rows: int = Field(10**9, ge=1, description="Largest shard size (rows) a hello may claim.")
    min_smoothness: float = Field(1e-6, gt=0, description="Smallest L_i a hello may claim.")
    max_smoothness: float = Field(
        1e12, gt=0, allow_inf_nan=False, description="Largest L_i a hello may claim."
    )
    update_norm_factor: float = Field(
        1e3,
        ge=1,
        allow_inf_nan=False,
        description="Refuse an update whose norm exceeds this multiple of the median of "
        "the last accepted updates' norms (plain/ef/dir updates, after the warm-up).",
    )
    update_norm_warmup: int = Field(
        16, ge=1, description="Accepted updates before the norm bound applies."
    )
    feedback: Literal["none", "ef", "ef21", "dir", "local", "any"] = Field(
        "ef21",
        description="The update family the job runs, announced on cat/<job>/job: ef21 (the "
        "agent's default; converges with many agents), or none, ef or dir (plain family); a "
        "hello of the other family is refused wrong_semantics. any: the first accepted hello "
        "fixes it.",
    )
    batch_size: float | None = Field(
        None,
        gt=0,
        description="Minibatch SGD: the batch every agent must use (rows, or a fraction of its "
        "shard like 0.1), announced on cat/<job>/job; an agent with another gives up. "
        "With AGG_LOCAL_STEPS: a fraction 1/k, H a multiple of k (whole passes a round). "
        "Unset: any, full gradients included.",
    )
    schedule_l2: float | None = Field(
        None,
        gt=0,
        description="Stochastic step schedule: gamma_t = min(gamma, 2 / (l2 (t + t0))) with "
        "this strong-convexity constant (the model's l2); unset: the constant step.",
    )
    schedule_t0: float = Field(0.0, ge=0, description="t0 of the stochastic step schedule.")
    local_steps: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Local training (LoCoDL with CAT both ways, docs/algorithm.md): H local "
        "steps per communication; every agent must run with --local-steps H. Sets "
        "AGG_FEEDBACK=local. Unset: no local training.",
    )
    comm_prob: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Local training with a drawn schedule (Scaffnew/ProxSkip's coin): each "
        "round's local steps are drawn so that a communication follows each step with this "
        "probability (geometric, mean 1/p), announced with the previous version; every agent "
        "must run with --comm-prob p. Instead of AGG_LOCAL_STEPS. Unset: none.",
    )
    local_rho: float = Field(
        DEFAULT_RHO, gt=0, le=1, description="Local training: LoCoDL's damping rho."
    )
    local_chi: float = Field(
        DEFAULT_CHI, gt=0, le=1, description="Local training: LoCoDL's damping chi."
    )
    local_step_factor: float | None = Field(
        None,
        gt=0,
        lt=2,
        description="Local training: the local step gamma = factor / L; unset: the tuned "
        "min(1, 2 / H).",
    )
    max_agents: int = Field(
        1000,
        ge=1,
        description="Registered agents at most; a hello from one more is refused "
        "(too_many_agents): bounds memory, the checkpoint and /agents.",
    )
    unproven_ttl_s: float = Field(
        600.0,
        gt=0,
        description="An agent that had no update accepted this many seconds after its first "
        "hello is forgotten and its slot freed (invented ids cannot hold AGG_MAX_AGENTS); it "
        "is told unknown_agent at its next update and says hello again.",
    )
    participation_window: int = Field(
        10,
        ge=1,
        description="K versions: a sync round's quorum counts agents with an accepted update "
        "in the last K versions; it also waits for agents that joined in the last K.",
    )
    cadence: bool = Field(
        False,
        description="Sync EF21 and local-training jobs: a round does not wait for a member "
        "whose duty cycle keeps its radio silent (its state keeps counting; a local member is "
        "absent and stays a member), unless it lags cadence_max_lag versions. "
        "Off by default: on a mixed LoRaWAN fleet it cut the time to target 2.6x and cost 5x "
        "the bytes (docs/results.md).",
    )
    cadence_max_lag: int = Field(
        16,
        ge=1,
        description="With cadence: a member whose last update is this many versions old is "
        "awaited again, silent or not (the staleness bound, docs/algorithm.md).",
    )
    checkpoint_every: int = Field(
        1, ge=1, description="Write checkpoint.npz every N versions (the journal covers the rest)."
    )
    # --- I/O
    transports: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["zmq+tcp://127.0.0.1:5555"],
        description="Comma-separated transport URLs, all served at once.",
    )
    client_id: str | None = Field(
        None, description="Transport client id (default aggregator-<job>)."
    )
    data_dir: Path = Field(Path("aggregator-data"), description="SQLite history + checkpoints.")
    eval_data: Path | None = Field(None, description="Dataset file for loss/accuracy.")
    standby: bool = Field(
        False,
        description="Wait for the aggregator holding AGG_DATA_DIR to die, then take over "
        "(docs/standby.md); false: exit 2 naming the holder.",
    )
    standby_poll_s: float = Field(
        0.2, gt=0, le=10.0, description="Seconds between a standby's tries for the lock."
    )
    # --- HTTP
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_token: SecretStr | None = Field(None, description="Bearer token for /control/*.")
    api_token_file: Path | None = Field(None, description="File holding the bearer token.")
    # --- MQTT options forwarded to mqtt:// and mqtts:// transports
    mqtt_username: str | None = None
    mqtt_password_file: Path | None = None
    mqtt_ca_file: Path | None = None
    mqtt_cert_file: Path | None = None
    mqtt_key_file: Path | None = None
    mqtt_tls_insecure: bool = False
    # --- ZeroMQ options forwarded to zmq+tcp:// transports (docs/operating.md)
    zmq_secret_key_file: Path | None = Field(
        None, description="The aggregator's CurveZMQ secret key: CURVE on both sockets."
    )
    zmq_agents_dir: Path | None = Field(
        None,
        description="Directory of <agent-id>.key public keys: only these agents may connect, "
        "each only as itself (needs AGG_ZMQ_SECRET_KEY_FILE).",
    )
    # --- per-agent MACs (docs/wire-format.md sections 3.3 and 11.1, docs/operating.md)
    mac_keys_dir: Path | None = Field(
        None,
        description="Directory of <agent-id>.mac keys (`edge-agent keys mac`): an update, "
        "hello, status or request from an agent with a key must carry a valid MAC (else "
        "refused bad_mac).",
    )
    require_mac: bool = Field(
        False,
        description="Refuse (bad_mac) every update, hello, status or request without a "
        "valid MAC, also from agents without a key (needs AGG_MAC_KEYS_DIR).",
    )
    # --- signed downlinks (docs/wire-format.md section 13, docs/operating.md)
    signing_key_file: Path | None = Field(
        None,
        description="The aggregator's Ed25519 secret key (`edge-agent keys signing`): every "
        "message to agents is signed; agents given the public key (--aggregator-key) act on "
        "signed ones only. Unset: nothing is signed.",
    )
    zmq_max_message_bytes: int | None = Field(
        None,
        ge=1024,
        le=MAX_PAYLOAD_BYTES,
        description="Largest inbound ZeroMQ frame; a peer sending more is disconnected before "
        "it is read (unset: 16 * d + 1 MiB, at most the engine's 256 MiB cap).",
    )
    zmq_sndhwm: int = Field(1000, ge=1, description="ZeroMQ send queue per peer (messages).")
    zmq_rcvhwm: int = Field(1000, ge=1, description="ZeroMQ receive queue per peer (messages).")

    _token: str | None = PrivateAttr(default=None)

    @field_validator("transports", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("transports")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one transport URL is needed, e.g. zmq+tcp://0.0.0.0:5555")
        for url in value:
            try:
                parse_url(url)
            except CatEdgeError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("aggregation")
    @classmethod
    def _check_aggregation(cls, value: str) -> str:
        parse_aggregation(value)
        return value

    @field_validator("job")
    @classmethod
    def _check_job(cls, value: str) -> str:
        return topics.validate_id(value, "job id")

    @model_validator(mode="after")
    def _resolve(self) -> Settings:
        if self.api_token is not None and self.api_token_file is not None:
            raise ValueError("set only one of AGG_API_TOKEN and AGG_API_TOKEN_FILE")
        if self.zmq_agents_dir is not None and self.zmq_secret_key_file is None:
            raise ValueError(
                "AGG_ZMQ_AGENTS_DIR needs AGG_ZMQ_SECRET_KEY_FILE (agent keys are checked on "
                "CURVE sockets only; make a key pair with `edge-agent keys zmq --server`)"
            )
        if self.min_smoothness > self.max_smoothness:
            raise ValueError("AGG_MIN_SMOOTHNESS must be <= AGG_MAX_SMOOTHNESS")
        if self.mode == "async" and self.dedupe_window < self.max_staleness:
            raise ValueError("AGG_DEDUPE_WINDOW must be >= AGG_MAX_STALENESS")
        self._check_local_training()
        token: str | None = None
        if self.api_token is not None:
            token = self.api_token.get_secret_value()
        elif self.api_token_file is not None:
            try:
                token = self.api_token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(
                    f"AGG_API_TOKEN_FILE: cannot read {self.api_token_file}: {exc.strerror}"
                ) from None
        if token is not None and len(token) < 16:
            raise ValueError("the API token must be at least 16 characters (AGG_API_TOKEN)")
        self._token = token
        return self

    def _check_local_training(self) -> None:
        """ValueError for local-training settings that are undefined or known to fail: one
        schedule (AGG_LOCAL_STEPS or AGG_COMM_PROB), feedback local, sync rounds, whole
        passes with minibatches and no decaying step."""
        if self.local_steps is not None and self.comm_prob is not None:
            raise ValueError(
                "AGG_LOCAL_STEPS and AGG_COMM_PROB: set one (every H local steps, or a drawn "
                "number of them with mean 1/p)"
            )
        if self.local_training:
            name = "AGG_LOCAL_STEPS" if self.comm_prob is None else "AGG_COMM_PROB"
            if "feedback" in self.model_fields_set and self.feedback != "local":
                raise ValueError(
                    f"{name} runs local training: AGG_FEEDBACK must be local or "
                    f"unset, not {self.feedback}"
                )
            if self.mode != "sync":
                raise ValueError(f"{name}: local training runs sync rounds (AGG_MODE)")
            if self.batch_size is not None:
                check_passes(
                    self.local_steps or 1,
                    self.batch_size,
                    comm_prob=self.comm_prob,
                    names=("AGG_LOCAL_STEPS", "AGG_BATCH_SIZE"),
                )
                if self.schedule_l2 is not None:
                    raise ValueError(
                        "AGG_SCHEDULE_L2: local training keeps its step fixed (a decaying "
                        "step would change LoCoDL's coefficients each round); unset it"
                    )
        elif self.feedback == "local":
            raise ValueError(
                "AGG_FEEDBACK=local needs AGG_LOCAL_STEPS (the local steps H) or AGG_COMM_PROB"
            )

    # ------------------------------------------------------------------ derived views

    @property
    def token(self) -> str | None:
        """The control API bearer token (None: control endpoints answer 503)."""
        return self._token

    @property
    def local_training(self) -> bool:
        """Whether the job runs local training (AGG_LOCAL_STEPS or AGG_COMM_PROB)."""
        return self.local_steps is not None or self.comm_prob is not None

    def local_config(self) -> LocalConfig | None:
        """The local-training configuration (None: neither AGG_LOCAL_STEPS nor
        AGG_COMM_PROB set; with the probability, H is its mean, for display only)."""
        if not self.local_training:
            return None
        mean_steps = None if self.comm_prob is None else max(1, round(1.0 / self.comm_prob))
        return LocalConfig(
            local_steps=self.local_steps or mean_steps or 1,
            comm_prob=self.comm_prob,
            step_factor=self.local_step_factor,
            chi=self.local_chi,
            rho=self.local_rho,
            batch_size=self.batch_size,
        )

    @property
    def effective_snapshot_every(self) -> int:
        """AGG_SNAPSHOT_EVERY as set, else 0 for a minibatch or local-training job (hundreds
        of versions, or copies that are always exact) and for a service without an MQTT
        transport (a periodic snapshot is there to be retained for late joiners, and
        ZeroMQ retains nothing: every live agent would just receive the whole model),
        else the engine's default."""
        if self.snapshot_every is not None:
            return self.snapshot_every
        if self.batch_size is not None or self.local_training:
            return 0
        if not any(parse_url(url).scheme in MQTT_SCHEMES for url in self.transports):
            return 0
        return EngineConfig.snapshot_every

    @property
    def transport_client_id(self) -> str:
        return self.client_id or f"aggregator-{self.job}"

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            job=self.job,
            d=self.d,
            model=self.model,
            mode=self.mode,
            step_size=self.step_size,
            max_rounds=self.max_rounds,
            target_loss=self.target_loss,
            quorum_min_agents=self.quorum_min_agents,
            quorum_fraction=self.quorum_fraction,
            min_agents=self.min_agents,
            round_deadline_s=self.round_deadline_s,
            async_apply_every=self.async_apply_every,
            max_staleness=self.max_staleness,
            liveness_timeout_s=self.liveness_timeout_s,
            dedupe_window=max(self.dedupe_window, self.max_staleness),
            snapshot_every=self.effective_snapshot_every,
            ef21_step_factor=self.ef21_step_factor,
            aggregation=parse_aggregation(self.aggregation),
            downlink=self.downlink,
            downlink_pacing=self.downlink_pacing,
            max_hold_s=self.max_hold_s,
            step_rule=self.step_rule,
            participation_window=self.participation_window,
            cadence=self.cadence,
            cadence_max_lag=self.cadence_max_lag,
            max_agents=self.max_agents,
            unproven_ttl_s=self.unproven_ttl_s,
            feedback="local" if self.local_training else self.feedback,
            batch_size=self.batch_size,
            schedule_l2=self.schedule_l2,
            schedule_t0=self.schedule_t0,
            local=self.local_config(),
            mac=self.mac_policy(),
            limits=Limits(
                max_rows=self.max_rows,
                min_smoothness=self.min_smoothness,
                max_smoothness=self.max_smoothness,
                update_norm_factor=self.update_norm_factor,
                update_norm_warmup=self.update_norm_warmup,
                profile_problem=profile_problem,
            ),
        )

    def mac_policy(self) -> MacPolicy:
        """The MAC keys of ``AGG_MAC_KEYS_DIR`` and ``AGG_REQUIRE_MAC`` (read from disk)."""
        if self.mac_keys_dir is None:
            if self.require_mac:
                raise SettingsError(
                    "AGG_REQUIRE_MAC=true needs AGG_MAC_KEYS_DIR (a directory of <agent-id>.mac "
                    "keys made with `edge-agent keys mac`), or every update is refused"
                )
            return MacPolicy()
        try:
            keys = read_keys_dir(self.mac_keys_dir)
        except MacKeyError as exc:
            raise SettingsError(f"AGG_MAC_KEYS_DIR: {exc}") from None
        return MacPolicy(keys=keys, required=self.require_mac)

    def downlink_signer(self) -> CountingSigner | None:
        """The signer of ``AGG_SIGNING_KEY_FILE`` (read from disk), its counter at least
        the wall clock in microseconds (so it rises across restarts); None when unset."""
        if self.signing_key_file is None:
            return None
        from edge_agent.protocol.signing import Signer

        try:
            signer = Signer(read_secret_key(self.signing_key_file))
        except SigningKeyError as exc:
            raise SettingsError(f"AGG_SIGNING_KEY_FILE: {exc}") from None
        return CountingSigner(signer, floor=lambda: time.time_ns() // 1000)

    @property
    def zmq_message_cap(self) -> int:
        """Largest inbound ZeroMQ frame in bytes (AGG_ZMQ_MAX_MESSAGE_BYTES or derived from d:
        a dense update with 16 bytes per coordinate plus 1 MiB of headroom)."""
        if self.zmq_max_message_bytes is not None:
            return self.zmq_max_message_bytes
        return min(MAX_PAYLOAD_BYTES, 16 * self.d + 2**20)

    def transport_options(self, url: str) -> dict[str, object]:
        """Keyword options for ``open_transport(url, ...)``: MQTT credentials/TLS for MQTT
        URLs; CURVE keys, the message cap and the high-water marks for ZeroMQ URLs."""
        parsed = parse_url(url)
        scheme = parsed.scheme
        if scheme == "zmq+tcp":
            zmq_options: dict[str, object] = {
                "max_message_bytes": self.zmq_message_cap,
                "sndhwm": self.zmq_sndhwm,
                "rcvhwm": self.zmq_rcvhwm,
            }
            if self.zmq_secret_key_file is not None:
                zmq_options["curve_server_secret_file"] = str(self.zmq_secret_key_file)
            if self.zmq_agents_dir is not None:
                zmq_options["curve_agents_dir"] = str(self.zmq_agents_dir)
            # An option spelled out in the URL's query string wins over the AGG_ZMQ_* value.
            return {k: v for k, v in zmq_options.items() if k not in parsed.options}
        if scheme not in MQTT_SCHEMES:
            return {}
        options: dict[str, object] = {}
        if self.mqtt_username is not None:
            options["username"] = self.mqtt_username
        for name in ("password_file", "ca_file", "cert_file", "key_file"):
            value = getattr(self, f"mqtt_{name}")
            if value is not None:
                options[name] = str(value)
        if self.mqtt_tls_insecure:
            options["tls_insecure"] = True
        return options

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, ConfigFileSource(settings_cls))


class ConfigFileSource(PydanticBaseSettingsSource):
    """Values from the file named by ``AGG_CONFIG_FILE`` (JSON object or .env lines)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self._values = self._read(os.environ.get(CONFIG_FILE_ENV))

    @staticmethod
    def _read(name: str | None) -> dict[str, Any]:
        if not name:
            return {}
        path = Path(name)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"{CONFIG_FILE_ENV}: cannot read {path}: {exc.strerror}") from None
        raw: Mapping[str, Any]
        if path.suffix.lower() == ".json":
            try:
                loaded = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SettingsError(f"{CONFIG_FILE_ENV}: {path} is not valid JSON: {exc}") from None
            if not isinstance(loaded, dict):
                raise SettingsError(f"{CONFIG_FILE_ENV}: {path} must hold a JSON object")
            raw = loaded
        else:
            raw = {k: v for k, v in dotenv_values(path).items() if v is not None}
        fields = Settings.model_fields
        out: dict[str, Any] = {}
        for key, value in raw.items():
            name = key.lower()
            if name.startswith(ENV_PREFIX.lower()):
                name = name[len(ENV_PREFIX) :]
            if name not in fields or name == "config_file":
                valid = ", ".join(sorted(fields))
                raise SettingsError(f"{path}: unknown setting {key!r}; valid names: {valid}")
            out[name] = value
        return out

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def load_settings(**overrides: Any) -> Settings:
    """Read the settings once (env, config file, ``overrides``); SettingsError on bad values."""
    values = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = err.get("loc") or ()
            field = str(loc[0]) if loc else ""
            where = env_name(field) if field else "settings"
            given = err.get("input")
            shown = "" if isinstance(given, dict) or field == "api_token" else f" (got {given!r})"
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            if err.get("type") == "missing":
                msg = "is required"
            problems.append(f"{where}: {msg}{shown}")
        raise SettingsError("invalid aggregator settings: " + "; ".join(problems)) from None
