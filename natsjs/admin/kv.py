"""placeholder"""


def register(top) -> None:
    pass
