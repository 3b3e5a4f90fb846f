"""The config's sections as typed, frozen values: one pydantic model per section, refusing fields it does
not know, each validating what it can alone (`root.Settings` checks what spans sections).

gateway/config.py reads a YAML file into them (`os.environ/NAME` references, every problem named by file,
field and line) and is where the rest of the gateway imports them from.
"""
