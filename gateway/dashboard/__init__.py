"""The dashboard: pages, charts, the savings ledger, and the guards on its forms and headers."""
