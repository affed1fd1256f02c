"""Byte units shared by every layer of phaze: a leaf module that imports nothing of phaze."""

from __future__ import annotations

#: bytes in a gibibyte (IEC 80000-13): HBM capacities (config ``place.hbm_gib``) and the GiB
#: figures of messages and plots
GIB = 2**30
