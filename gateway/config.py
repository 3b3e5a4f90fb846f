"""The gateway's YAML config: loading, `os.environ/NAME` references, validation.

Every error names the file, the field (as a dotted path such as
`tenants[0].api_keys[1]`) and what is wrong, so `gateway check-config` and a
failed start both say exactly where to look.

The sections themselves are declared in gateway/settings/ (one module per group
of sections, `Settings` in root.py); they are imported from here.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gateway.settings.models import ModelSettings, RouterSettings
from gateway.settings.root import Settings, key_digest
from gateway.settings.server import DashboardSettings, RedisSettings, ServerSettings, TelemetrySettings
from gateway.settings.storage import BlobSettings, StorageSettings
from gateway.settings.tenants import (
    BudgetSettings, LimitSettings, RetentionClassSettings, RetentionSettings, TenantSettings,
)
from gateway.yaml_lines import YamlLines
from policies.policy import Policy, PolicyError, policy_from_mapping
from policies.presets import PRESET_NAMES, preset
from policies.validation import field_path

__all__ = [
    "ENV_PREFIX", "PLACEHOLDER", "ConfigError", "load_settings", "parse_settings", "read_yaml", "policy_file",
    "load_policy", "tenant_policies",
    # the sections (gateway/settings/)
    "Settings", "key_digest", "ModelSettings", "RouterSettings", "ServerSettings", "DashboardSettings",
    "RedisSettings", "TelemetrySettings", "StorageSettings", "BlobSettings", "TenantSettings", "LimitSettings",
    "BudgetSettings", "RetentionSettings", "RetentionClassSettings",
]

ENV_PREFIX = "os.environ/"
PLACEHOLDER = "REPLACE-ME"  # deploy/k8s/secrets.yaml's values: a config holding one is refused


class ConfigError(Exception):
    """A config that cannot be served, with the file and field at fault (and the field's line, when known).

    `problems` holds every problem found in one reading (each a ConfigError of one problem), so a
    config with several mistakes is refused with all of them; `field` and `problem` are the first's.
    """

    def __init__(self, path: str | os.PathLike[str], field: str, problem: str, line: int | None = None,
                 problems: "list[ConfigError] | None" = None) -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        self.line = line
        self.problems = problems or [self]
        super().__init__("\n".join(p.one_line() for p in self.problems))

    def one_line(self) -> str:
        where = f"{self.path}: {self.field}" if self.field else self.path
        at = f" (line {self.line})" if self.line is not None and not self.field.startswith("line ") else ""
        return f"{where}{at}: {self.problem}"

    @classmethod
    def of(cls, problems: "list[ConfigError]") -> "ConfigError":
        first = problems[0]
        return cls(first.path, first.field, first.problem, first.line, problems)


def _resolve_env(value: Any, where: str, path: str, missing: list[ConfigError],
                 loc: tuple[Any, ...] = (), lines: YamlLines | None = None) -> Any:
    """`value` with every `os.environ/NAME` read; each variable that is not set is added to `missing`."""
    if isinstance(value, dict):
        return {k: _resolve_env(v, f"{where}.{k}" if where else str(k), path, missing, (*loc, k), lines)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, f"{where}[{i}]", path, missing, (*loc, i), lines) for i, v in enumerate(value)]
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        if name not in os.environ:
            missing.append(ConfigError(path, where, f"environment variable {name} is not set",
                                       lines.line(loc) if lines else None))
            return value
        if PLACEHOLDER in os.environ[name]:
            missing.append(ConfigError(path, where, f"environment variable {name} holds a placeholder "
                                       f"({PLACEHOLDER}...): set the real value", lines.line(loc) if lines else None))
        return os.environ[name]
    if isinstance(value, str) and PLACEHOLDER in value:
        missing.append(ConfigError(path, where, f"a placeholder ({PLACEHOLDER}...): set the real value",
                                   lines.line(loc) if lines else None))
    return value


def _close_field(loc: tuple[Any, ...]) -> str | None:
    """The field name close to an unknown one that its section knows (`tenantz` -> `tenants`), or None."""
    model: Any = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            if isinstance(part, int):
                continue
            return None
        annotation = field.annotation
        inner = getattr(annotation, "__args__", None)
        model = next((a for a in inner or (annotation,) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return close[0] if close else None


def _validation_problems(exc: ValidationError, path: str, lines: YamlLines | None) -> list[ConfigError]:
    """One problem per field pydantic refused, unknown fields first. A misspelt field shows as unknown
    and, often, as the field it meant missing or invalid too: the spelling is named, the other left out."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    meant = {(*e["loc"][:-1], close) for e in errors if e["type"] == "extra_forbidden"
             for close in [_close_field(tuple(e["loc"]))] if close}
    problems = []
    for error in errors:
        loc = tuple(error["loc"])
        field = field_path(loc)
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            close = _close_field(loc)
            message = "unknown field" + (f"; did you mean {close!r}?" if close else "")
        if error["type"] == "missing":
            message = "required field is missing"
        if not field and ": " in message:  # a model-level check names its own field
            field, message = message.split(": ", 1)
            loc = _loc_of(field)
        inner = re.match(rf"{re.escape(str(loc[-1]))}\.(\w+):? ", message) if loc else None
        if inner:  # "litellm_params.api_bse is not ...": the key itself is the field at fault
            field, loc, message = f"{field}.{inner.group(1)}", (*loc, inner.group(1)), message[inner.end():]
        if loc not in meant:
            problems.append(ConfigError(path, field, message, lines.line(loc) if lines else None))
    return problems


def _loc_of(field: str) -> tuple[Any, ...]:
    """`tenants[0].api_keys` as a path: ("tenants", 0, "api_keys")."""
    return tuple(int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", field))


def parse_settings(raw: Any, path: str = "<memory>", base_dir: str = ".", lines: YamlLines | None = None) -> Settings:
    """Settings from a parsed config; ConfigError naming every problem found (with its line, given `lines`)."""
    if not isinstance(raw, dict):
        raise ConfigError(path, "", "the config must be a YAML mapping")
    if "model_list" in raw and "models" not in raw:  # before its os.environ/ references fail one by one
        raise ConfigError(path, "", "this looks like a LiteLLM Proxy config (model_list); "
                          f"convert it with `gateway migrate-config {path}`")
    problems: list[ConfigError] = []
    resolved = _resolve_env(raw, "", path, problems, (), lines)
    problems += _policy_problems(resolved, path, base_dir, lines)  # every policy loads, or the config is refused
    try:
        settings = Settings.model_validate({**resolved, "source": path, "base_dir": base_dir})
    except ValidationError as exc:
        said = {problem.field for problem in problems}  # a value left as os.environ/NAME, a policy: said once
        invalid = [p for p in _validation_problems(exc, path, lines) if p.field not in said]
        raise ConfigError.of(problems + invalid) from exc
    if problems:
        raise ConfigError.of(problems)
    return settings


def _policy_problems(raw: dict[str, Any], path: str, base_dir: str, lines: YamlLines | None) -> list[ConfigError]:
    """The tenants' policies that do not load (presets by name, files relative to the config's folder)."""
    tenants = raw.get("tenants")
    problems = []
    for index, tenant in enumerate(tenants if isinstance(tenants, list) else []):
        reference = tenant.get("policy", "default") if isinstance(tenant, dict) else None
        if not isinstance(reference, str):
            continue  # the schema says what is wrong with it
        field = f"tenants[{index}].policy"
        try:
            _policy(reference, Path(base_dir), path, field)
        except ConfigError as error:
            line = lines.line(("tenants", index, "policy")) if lines and error.path == path else error.line
            problems.append(ConfigError(error.path, error.field, error.problem, line))
    return problems


def read_yaml(file: Path) -> Any:
    return _read_yaml(file)[0]


def _read_yaml(file: Path) -> tuple[Any, YamlLines]:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read the file ({exc.strerror})") from exc
    try:
        return yaml.safe_load(text), YamlLines.of(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise ConfigError(file, where, f"not valid YAML ({getattr(exc, 'problem', exc)})") from exc


def policy_file(file: Path) -> Policy:
    """A YAML policy file; errors name the file and the field."""
    try:
        return policy_from_mapping(read_yaml(file), str(file))
    except PolicyError as exc:
        raise ConfigError(exc.source, exc.field, exc.problem) from exc


def load_policy(reference: str, settings: Settings, field: str) -> Policy:
    """A preset by name, or a YAML policy file (relative to the config file)."""
    return _policy(reference, Path(settings.base_dir), settings.source, field)


def _policy(reference: str, base_dir: Path, source: str, field: str) -> Policy:
    if reference in PRESET_NAMES:
        return preset(reference)
    file = Path(reference) if Path(reference).is_absolute() else base_dir / reference
    if not file.is_file():
        close = difflib.get_close_matches(reference, PRESET_NAMES, n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(source, field,
                          f"{reference!r} is neither a preset ({', '.join(PRESET_NAMES)}) nor a policy file{hint}")
    return policy_file(file)


def tenant_policies(settings: Settings) -> dict[str, Policy]:
    return {
        tenant.id: load_policy(tenant.policy, settings, f"tenants[{index}].policy")
        for index, tenant in enumerate(settings.tenants)
    }


def load_settings(path: str | os.PathLike[str]) -> Settings:
    file = Path(path)
    raw, lines = _read_yaml(file)
    return parse_settings(raw, str(file), str(file.resolve().parent), lines)
