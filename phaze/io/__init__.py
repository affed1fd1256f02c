"""Table schemas and atomic file output shared by every stage."""

from phaze.io.atomic import atomic_path, write_json_atomic, write_text_atomic
from phaze.io.tables import SCHEMAS, read_table, write_table

__all__ = [
    "SCHEMAS",
    "atomic_path",
    "read_table",
    "write_json_atomic",
    "write_table",
    "write_text_atomic",
]
