"""The base of every config section: unknown fields are refused (a misspelt field is an error, not a
silent default) and values are frozen once read."""
from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

SHA256_KEY = re.compile(r"^sha256:[0-9a-f]{64}$")  # a key or token given as its digest


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
