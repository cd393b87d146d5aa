from apply.core.backoff import retry_delay


def test_the_wait_doubles_up_to_the_cap() -> None:
    waits = [retry_delay(n, 5.0, 60.0) for n in range(1, 7)]
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    assert retry_delay(0, 5.0, 60.0) == 0.0 and retry_delay(10_000, 5.0, 60.0) == 60.0
