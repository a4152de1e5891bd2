"""placeholder"""


def register_stream(g) -> None:
    pass
