#!/bin/sh
# Tile tables: defaults, reading back what the sweep writes, fallback, malformed tables, and the
# sweep's objectives (how a setting is picked from timings).
exec build/san/t/tiles
