"""The committed JSON Schema files for bots written in other languages."""

from __future__ import annotations

import json
from pathlib import Path

from chatmem.schemas.events import event_json_schemas

SCHEMA_DIR = Path(__file__).resolve().parent / "jsonschema"


def rendered() -> dict[str, str]:
    return {
        f"{name}.schema.json": json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, schema in event_json_schemas().items()
    }


def write_schemas(check: bool = False) -> list[str]:
    """Return the names of files that differ; rewrite them unless check is set."""
    stale = []
    for name, text in rendered().items():
        path = SCHEMA_DIR / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
            if not check:
                SCHEMA_DIR.mkdir(exist_ok=True)
                path.write_text(text, encoding="utf-8")
    return stale
