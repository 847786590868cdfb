"""SQLite checkpoints whose serializer knows every record type of the state (no
'unregistered type' warnings on reload), and LangGraph time travel helpers."""
from __future__ import annotations

import pathlib
import sqlite3

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from state import RECORD_TYPES


def serializer() -> JsonPlusSerializer:
    allowed = [(t.__module__, t.__name__) for t in RECORD_TYPES]
    return JsonPlusSerializer(allowed_msgpack_modules=allowed)


def sqlite_saver(path: str | pathlib.Path) -> SqliteSaver:
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False)
    return SqliteSaver(conn, serde=serializer())
