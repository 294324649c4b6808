"""Settings: frozen and validated once, read from flags, `STREAM_NDCG_*` variables or a TOML file.

Every setting is declared in `setting_fields` (`Declared`, which `Settings` derives from); the
parsers of their values are in `setting_values`, the reading of a TOML file in `settings_file`.

Precedence: flags, then environment variables, then the TOML file (``--config``
or ``STREAM_NDCG_CONFIG``), then defaults. Every setting has the same name in
all three: ``--batch-size``, ``STREAM_NDCG_BATCH_SIZE``, ``batch_size = 500``.

Each setting is declared once, as a field of `Declared` made by `setting()`: its
default, its parser (which also checks it), its help line, its allowed values and
whether it is a secret. The flags of `run` and `check-config`, the environment
variable names, the TOML keys and the table of docs/configuration.md are all derived
from those fields, so none of them can drift from the others.

    settings = Settings.load(flags={"k": "5,10"}, environ=os.environ)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from stream_ndcg import setting_values as values
from stream_ndcg.errors import ConfigError
from stream_ndcg.metric import Measure
from stream_ndcg.setting_fields import DURATION, MECHANISMS, Declared, SettingError, Spec
from stream_ndcg.settings_file import read_toml, suggest

ENV_PREFIX = "STREAM_NDCG_"
# Below this, a timestamp in epoch milliseconds is before March 1973: almost surely epoch seconds.
EPOCH_SECONDS_BELOW_MS = 10**11


@dataclass(frozen=True)
class Settings(Declared):
    """The service's whole configuration. Durations are in milliseconds.

    Constructing one parses and checks every field (so `Settings(batch_size="500")` holds
    500); `load` merges the sources and says which one a wrong value came from.
    """

    def __post_init__(self) -> None:
        for name, spec in self.specs().items():
            try:
                value = spec.parse(getattr(self, name))
            except values.Bad as exc:
                raise SettingError(name, str(exc)) from None
            # Frozen: the normalised value replaces the given one before anyone can see it.
            object.__setattr__(self, name, value)
        if any(w % self.bucket for w in self.windows):
            raise SettingError("windows", f"each window must be a whole number of buckets: "
                               f"{','.join(map(values.format_duration, self.windows))} with bucket "
                               f"{values.format_duration(self.bucket)}")
        if not values.NAMESPACE.match(self.key_namespace):
            raise SettingError("group_id", f"{self.group_id!r}: the namespace (by default the group id) may hold "
                               "letters, digits, '_', '.' and '-' only; set namespace to use this group id")
        parts = urlsplit(self.redis_url)
        if self.redis_cluster and (parts.scheme == "unix" or parts.path.strip("/") not in ("", "0")):
            raise SettingError("redis_url", f"{values.mask_url(self.redis_url)!r}: a Redis Cluster "
                               "(redis_cluster=true) is reached over TCP and has database 0 only")
        if self.redis_wait_replicas and self.redis_cluster:
            raise SettingError("redis_wait_replicas", "not with redis_cluster: a commit's WAIT would have to go to "
                               "every master it wrote to")
        if self.redis_sentinels and self.redis_cluster:
            raise SettingError("redis_sentinels", "a Redis Cluster fails over by itself: set redis_sentinels or "
                               "redis_cluster, not both")
        if self.security_protocol.startswith("SASL"):
            if not self.sasl_mechanism:
                raise SettingError("sasl_mechanism", f"needed with {self.security_protocol}: one of "
                                   f"{', '.join(MECHANISMS)}")
            if not self.sasl_username or not self.sasl_password:
                raise SettingError("sasl_password" if self.sasl_username else "sasl_username",
                                   f"{self.security_protocol} needs sasl_username and sasl_password")
        if self.ubi_output_topic in (self.ubi_queries_topic, self.ubi_events_topic) \
                or self.ubi_queries_topic == self.ubi_events_topic:
            raise SettingError("ubi_output_topic", "the UBI queries, UBI events and output topics must be three")
        if self.ubi_impression_wait >= self.ubi_search_ttl:
            raise SettingError("ubi_search_ttl", "must be longer than ubi_impression_wait")
        if self.control and self.control.partition("=")[0] not in self.segment_labels:
            raise SettingError("control", f"{self.control!r}: its label is not one of segment_labels "
                               f"({','.join(self.segment_labels) or 'none'})")
        for experiment in self.experiments:
            if experiment.label not in self.segment_labels:
                raise SettingError("experiments", f"experiment {experiment.name}: its label {experiment.label!r} is "
                                   f"not one of segment_labels ({','.join(self.segment_labels) or 'none'})")
        # Frozen: each experiment takes the settings' alpha and n_star where it names none.
        object.__setattr__(self, "experiments", tuple(experiment.with_defaults(self.alpha, self.n_star)
                                                      for experiment in self.experiments))
        if self.dead_letter_topic and self.dead_letter_topic in self.topics:
            raise SettingError("dead_letter_topic", f"{self.dead_letter_topic!r} is an input topic: "
                               "dead letters need a topic of their own")

    @property
    def measure(self) -> Measure:
        return Measure(cutoffs=self.k, gain=self.gain, ideal=self.ideal,  # type: ignore[arg-type]
                       sources=self.judgment_sources)

    @property
    def key_namespace(self) -> str:
        return self.namespace or self.group_id

    @property
    def metric_config(self) -> dict[str, object]:
        """What the stored numbers mean: state built with other values cannot be continued."""
        return {"k": list(self.k), "gain": self.gain, "ideal": self.ideal, "bucket": self.bucket,
                "windows": list(self.windows), "segment_labels": list(self.segment_labels),
                "judgment_sources": list(self.judgment_sources),
                # Only with some: the record of state without experiments stays as it was.
                **({"experiments": [experiment.recorded() for experiment in self.experiments]}
                   if self.experiments else {})}

    @property
    def horizon(self) -> int:
        """How far back state is kept: the longest window plus the grace."""
        return max(self.windows) + self.grace

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        """Every setting's declaration, in the order of the fields."""
        return {f.name: f.metadata["spec"] for f in fields(cls)}

    @classmethod
    def names(cls) -> list[str]:
        return list(cls.specs())

    @classmethod
    def kafka_names(cls) -> list[str]:
        """The settings every Kafka client needs to connect: `simulate` takes them too."""
        return [name for name, spec in cls.specs().items() if spec.kafka]

    @classmethod
    def load(
        cls,
        flags: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        config_file: str | None = None,
    ) -> Settings:
        """Merge the sources (flags win) and validate; ConfigError names the setting, its value and
        where the value came from."""
        environ = environ or {}
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        path = config_file or environ.get(ENV_PREFIX + "CONFIG")
        if path:
            for name, value in read_toml(path, cls.names()).items():
                values[name], sources[name] = value, path
        for name in cls.names():
            if env_name(name) in environ:
                values[name], sources[name] = environ[env_name(name)], env_name(name)
        for name, value in (flags or {}).items():
            if value is not None:
                values[name], sources[name] = value, flag_name(name)
        unknown = set(values) - set(cls.names())
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}{suggest(unknown, cls.names())}")
        try:
            return cls(**values)
        except SettingError as exc:
            source = sources.get(exc.setting)
            if source is None:
                raise ConfigError(f"setting {exc.setting} (default): {exc.problem}") from None
            raise ConfigError(f"setting {exc.setting} (from {source}): {exc.problem}") from None

    def secret_values(self) -> list[str]:
        """The secrets themselves, for log redaction (their repr too: byte strings get logged)."""
        values = [self.sasl_password, urlsplit(self.redis_url).password or ""]
        return [form for value in values if value for form in (value, repr(value.encode())[2:-1])]

    def kafka_client_options(self) -> dict[str, Any]:
        """Connection and security options shared by every Kafka client of the service."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers.split(","),
                                   "security_protocol": self.security_protocol}
        if self.security_protocol.startswith("SASL"):
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password)
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, name):
                options[name] = getattr(self, name)
        return options

    def masked(self) -> dict[str, Any]:
        """The effective settings for people to read, with credentials replaced by '***'."""
        shown: dict[str, Any] = {}
        for name, spec in self.specs().items():
            value = getattr(self, name)
            if spec.secret:
                value = values.mask_url(value) if name.endswith("_url") else ("***" if value else "")
            elif spec.metavar.startswith(DURATION):
                value = ([values.format_duration(v) for v in value] if isinstance(value, tuple)
                         else values.format_duration(value))
            elif name == "experiments":
                value = tuple(experiment.recorded() for experiment in value)
            shown[name] = list(value) if isinstance(value, tuple) else value
        return shown


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")
