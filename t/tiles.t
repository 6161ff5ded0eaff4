#!/bin/sh
# Tile tables: defaults, reading back what the sweep writes, fallback, malformed tables.
exec build/san/t/tiles
