"""Agent modules for the override and extension tests: `catalog` declares, `alpha` and `beta` patch it.

Not named agents*.py, so the other tests' workers do not load them: each test lists the modules it wants,
in the order it wants."""
