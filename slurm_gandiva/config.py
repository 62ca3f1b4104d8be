"""The site configuration file (etc/gandiva.conf): parsing, validation and the privilege check.

The controller runs by it; `gandiva sbatch` and `gandiva report` read it for the jobs directory and the
database.

Format: `key = value` lines, `#` or `;` comments, blank lines ignored. An optional `[controller]`
section holds the same keys; a `[policy]` section holds the policy's parameters (passed to
`make_policy(name, **params)`), as does any top-level `policy.<param> = value` line. Every error
names the file and line: `gandiva.conf:12: quantum must be a positive number of seconds`.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_gandiva.errors import ConfigError, PermissionDenied
from slurm_gandiva.requeue.contract import suspend_signal

DEFAULT_CONFIG_PATHS = ("/etc/gandiva/gandiva.conf", "etc/gandiva.conf")
CONFIG_ENV = "GANDIVA_CONF"

ParamValue = str | int | float | bool


@dataclass(frozen=True)
class ControllerConfig:
    """Validated settings of one controller. Times are seconds."""

    state_dir: Path = Path("/var/lib/gandiva")
    database_url: str = ""  # empty: sqlite file <state_dir>/gandiva.db
    jobs_dir: Path | None = None  # per-job wrapper state dirs (<jobs_dir>/<job id>); None: <state_dir>/jobs
    quantum: float = 60.0
    tick: float = 5.0
    introspect: float = 30.0
    policy: str = "gandiva"
    policy_params: tuple[tuple[str, ParamValue], ...] = ()
    signal: str = "USR2"
    suspend_timeout: float = 120.0
    partitions: tuple[str, ...] = ()  # empty: every partition
    topology_file: Path = Path("/etc/gandiva/topology.json")
    slurm_conf: Path | None = None  # None: Slurm's default / $SLURM_CONF
    metrics_port: int = 0  # 0: no metrics endpoint
    metrics_addr: str = "127.0.0.1"
    round_log: Path | None = None  # None: off; else each round's view and plan, a JSON line each
    round_log_max_mb: float = 50.0  # the round log is renamed to <round_log>.1 before it grows past this
    max_nodes: int | None = None  # most nodes one job may span; None: as many as the cluster has
    max_registrations: int = 500  # new jobs registered per round, shared fairly between users
    # Tenants' fair shares (selector/fairshare.py): "none" or "shares"; the decay half-life of their usage.
    # The controller applies them with the shares it reads from slurmdbd, read again every accounting_refresh
    # seconds (the GPU limits of associations and QOS apply whatever the fairness).
    fairness: str = "none"
    fairness_half_life: float = 7 * 86400.0
    fairness_steer_grows: bool = False  # `FairShare.steer_grows`: spare GPUs to tenants below their share first
    accounting_refresh: float = 60.0
    # Co-held GPUs (issue 31, controller/cohold.py): jobs taking turns on the same GPUs each hold a shard of
    # them and switch in place (park / unpark) instead of through the requeue protocol. Needs a Slurm whose
    # held jobs switch between shards and whole GPUs (`SlurmCapabilities.packing`); elsewhere it stays off.
    co_hold: bool = False
    source: str = "<defaults>"

    @property
    def params(self) -> dict[str, ParamValue]:
        """The policy's parameters as keyword arguments."""
        return dict(self.policy_params)

    @property
    def db_url(self) -> str:
        """The SQLAlchemy URL of the store."""
        return self.database_url or f"sqlite:///{self.state_dir / 'gandiva.db'}"

    @property
    def job_root(self) -> Path:
        """Where the wrapper of job J keeps its files: <job_root>/J."""
        return self.jobs_dir if self.jobs_dir is not None else self.state_dir / "jobs"

    def slurm_env(self) -> dict[str, str]:
        """Environment for Slurm commands (SLURM_CONF when configured)."""
        env = dict(os.environ)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env


def _positive_seconds(v: str) -> float:
    x = float(v)
    if not x > 0 or x != x or x == float("inf"):
        raise ValueError
    return x


def _port(v: str) -> int:
    x = int(v)
    if not 0 <= x <= 65535:
        raise ValueError
    return x


def _positive_int(v: str) -> int:
    x = int(v)
    if x < 1:
        raise ValueError
    return x


def _max_nodes(v: str) -> int | None:
    if v.strip().lower() in ("", "any", "all"):
        return None
    x = int(v)
    if x < 1:
        raise ValueError
    return x


def _partitions(v: str) -> tuple[str, ...]:
    parts = tuple(p for p in re.split(r"[,\s]+", v) if p)
    if not all(re.fullmatch(r"[A-Za-z0-9_.-]+", p) for p in parts):
        raise ValueError
    return parts


class _Refused(ValueError):
    """A value refused with its own one-line reason (said instead of the key's generic message)."""


def _signal(v: str) -> str:
    try:
        return suspend_signal(v).name.removeprefix("SIG")
    except ValueError as exc:
        raise _Refused(f"signal = {v}: {exc}") from None


def _policy_name(v: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", v):
        raise ValueError
    return v


def _fairness(v: str) -> str:
    if v.lower() not in ("none", "shares"):
        raise ValueError
    return v.lower()


def _yes_no(v: str) -> bool:
    low = v.strip().lower()
    if low in ("yes", "true", "on", "1"):
        return True
    if low in ("no", "false", "off", "0"):
        return False
    raise ValueError


def _url(v: str) -> str:
    if "://" not in v:
        raise ValueError
    return v


# key -> (parser, field name, what to say when the value is bad)
_KEYS: dict[str, tuple[Callable[[str], object], str, str]] = {
    "state_dir": (Path, "state_dir", "state_dir must be a directory path"),
    "database_url": (_url, "database_url", "database_url must be a SQLAlchemy URL like sqlite:////path/db"),
    "jobs_dir": (Path, "jobs_dir", "jobs_dir must be a directory path"),
    "quantum": (_positive_seconds, "quantum", "quantum must be a positive number of seconds"),
    "tick": (_positive_seconds, "tick", "tick must be a positive number of seconds"),
    "introspect": (_positive_seconds, "introspect", "introspect must be a positive number of seconds"),
    "policy": (_policy_name, "policy", "policy must be a policy name such as gandiva, afs-l or fifo"),
    "signal": (_signal, "signal", "signal must be a signal name such as USR2"),
    "suspend_timeout": (
        _positive_seconds, "suspend_timeout", "suspend_timeout must be a positive number of seconds",
    ),
    "partitions": (_partitions, "partitions", "partitions must be a comma-separated list of partition names"),
    "topology_file": (Path, "topology_file", "topology_file must be a file path"),
    "slurm_conf": (Path, "slurm_conf", "slurm_conf must be a file path"),
    "metrics_port": (_port, "metrics_port", "metrics_port must be a port number 0-65535 (0 turns it off)"),
    "metrics_addr": (str, "metrics_addr", "metrics_addr must be an address to listen on"),
    "round_log": (Path, "round_log", "round_log must be a file path"),
    "round_log_max_mb": (
        _positive_seconds, "round_log_max_mb", "round_log_max_mb must be a positive number of megabytes",
    ),
    "max_nodes": (_max_nodes, "max_nodes", "max_nodes must be a whole number of nodes, at least 1, or `any`"),
    "max_registrations": (
        _positive_int, "max_registrations", "max_registrations must be a whole number of jobs, at least 1",
    ),
    "fairness": (_fairness, "fairness", "fairness must be none or shares (tenants' GPU time split by their shares)"),
    "fairness_half_life": (
        _positive_seconds, "fairness_half_life",
        "fairness_half_life must be a positive number of seconds (Slurm's PriorityDecayHalfLife; 604800 = 7 days)",
    ),
    "fairness_steer_grows": (
        _yes_no, "fairness_steer_grows",
        "fairness_steer_grows must be yes or no (an elastic policy grows the jobs of tenants below their share first)",
    ),
    "accounting_refresh": (
        _positive_seconds, "accounting_refresh",
        "accounting_refresh must be a positive number of seconds (how often shares and GPU limits are read again)",
    ),
    "co_hold": (
        _yes_no, "co_hold",
        "co_hold must be yes or no (jobs taking turns on the same GPUs switch in place, each holding a shard)",
    ),
}
_ALIASES = {"database": "database_url", "db": "database_url", "topology": "topology_file"}


def _param_value(v: str) -> ParamValue:
    low = v.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def parse_config(text: str, source: str = "gandiva.conf") -> ControllerConfig:
    """Parse and validate config text; errors say `source:LINE: what is wrong and what to do`."""
    values: dict[str, object] = {}
    params: dict[str, ParamValue] = {}
    seen: dict[str, int] = {}
    section = "controller"
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        where = f"{source}:{lineno}"
        m = re.fullmatch(r"\[\s*([A-Za-z_]+)\s*\]", line)
        if m:
            section = m.group(1).lower()
            if section not in ("controller", "policy"):
                raise ConfigError(f"{where}: unknown section [{section}]; use [controller] or [policy]")
            continue
        if "=" not in line:
            raise ConfigError(f"{where}: expected 'key = value', got {line!r}")
        key, _, value = line.partition("=")
        key = key.strip().lower().replace("-", "_")
        value = value.split(" #", 1)[0].strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if section == "policy" or key.startswith("policy."):
            pkey = key.removeprefix("policy.")
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", pkey):
                raise ConfigError(f"{where}: bad policy parameter name {pkey!r}; use letters, digits and _")
            params[pkey] = _param_value(value)
            continue
        key = _ALIASES.get(key, key)
        if key not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {known}")
        if key in seen:
            raise ConfigError(f"{where}: {key} is already set on line {seen[key]}; keep one")
        seen[key] = lineno
        parse, name, msg = _KEYS[key]
        if not value:
            raise ConfigError(f"{where}: {msg}")
        try:
            values[name] = parse(value)
        except _Refused as exc:
            raise ConfigError(f"{where}: {exc}") from None
        except (ValueError, TypeError):
            raise ConfigError(f"{where}: {msg}") from None
    cfg = ControllerConfig(policy_params=tuple(sorted(params.items())), source=source, **values)  # type: ignore[arg-type]
    if cfg.tick > cfg.quantum:
        where_line = seen.get("tick", seen.get("quantum", 0))
        raise ConfigError(
            f"{source}:{where_line}: tick ({cfg.tick:g} s) must not be longer than quantum ({cfg.quantum:g} s)"
        )
    return cfg


def load_config(path: str | os.PathLike[str] | None = None) -> ControllerConfig:
    """Read the config file: `path`, else $GANDIVA_CONF, else the first of DEFAULT_CONFIG_PATHS."""
    if path is None:
        env = os.environ.get(CONFIG_ENV)
        candidates = [env] if env else list(DEFAULT_CONFIG_PATHS)
        found = next((c for c in candidates if Path(c).is_file()), None)
        if found is None:
            raise ConfigError(
                f"no config file found (tried {', '.join(candidates)}); pass --config FILE or set {CONFIG_ENV}"
            )
        path = found
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror}); check the path") from None
    return parse_config(text, source=str(p))


def slurm_user(slurm_conf: Path | None) -> str:
    """SlurmUser from slurm.conf (Slurm's default is root)."""
    conf = slurm_conf or Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    try:
        text = conf.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "root"
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.fullmatch(r"(?i)SlurmUser\s*=\s*(\S+)", line)
        if m:
            return m.group(1)
    return "root"


def check_privilege(cfg: ControllerConfig, *, euid: int | None = None) -> str:
    """Refuse to run as a user who cannot place admin holds; returns the user name when allowed."""
    uid = os.geteuid() if euid is None else euid
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    if uid == 0:
        return name
    su = slurm_user(cfg.slurm_conf)
    if name == su:
        return name
    raise PermissionDenied(
        f"the controller runs as {name!r}, which cannot place admin holds (only root or SlurmUser {su!r} can); "
        "run it as root or as the SlurmUser"
    )
