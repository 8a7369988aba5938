#!/usr/bin/env python3
"""Independent check of constrained outputs: every output must parse as JSON and validate against its
schema with python3-jsonschema (Debian). Input: a JSON file [{"name", "schema", "output"}...].
Prints one line per failure and exits 1 if any; prints 'VALIDATED N' otherwise."""
import json
import sys

import jsonschema

cases = json.load(open(sys.argv[1], encoding="utf-8"))
bad = 0
for c in cases:
    try:
        value = json.loads(c["output"])
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {c['name']}: not JSON ({e}): {c['output']!r}")
        bad += 1
        continue
    cls = jsonschema.validators.validator_for(c["schema"], default=jsonschema.Draft202012Validator)
    errors = list(cls(c["schema"], format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    if errors:
        print(f"FAIL {c['name']}: {errors[0].message}: {c['output']!r}")
        bad += 1
print(f"VALIDATED {len(cases) - bad}/{len(cases)} with jsonschema {getattr(jsonschema, '__version__', '?')}")
sys.exit(1 if bad else 0)
