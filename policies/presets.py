"""Names of the built-in policy presets a tenant may name instead of a file."""

PRESET_NAMES = ("default", "coding-agent", "passthrough")
