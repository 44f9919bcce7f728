#!/usr/bin/env bash
# Side by side with Gloo over TCP: see bench/compare.sh (BASELINE=gloo) for what it runs and its settings.
exec env BASELINE=gloo "$(dirname "${BASH_SOURCE[0]}")/compare.sh" "$@"
