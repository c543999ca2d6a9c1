"""Type stubs of the compiled CPU-feature probe."""

# Cython's doctest table.
__test__: dict[str, str]

def cpu_supports() -> list[str]: ...
def compiler() -> str: ...
