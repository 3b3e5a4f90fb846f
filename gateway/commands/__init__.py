"""The CLI's commands beyond serving: replay, check-config, migrate-config, demo."""
