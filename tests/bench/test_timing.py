"""interleaved_medians: one sample of each sampler a round, in an order that varies, medians kept apart."""

from tiledispatch.bench.timing import interleaved_medians


def test_each_sampler_once_a_round_in_varying_orders():
    rounds, calls = 6, []
    values = {"a": [3.0, 1.0, 2.0, 9.0, 2.0, 2.0], "b": [5.0] * 6, "c": [7.0, 8.0, 6.0, 7.0, 7.0, 0.0]}

    def sampler(name):
        def sample():
            calls.append(name)
            return values[name][sum(1 for c in calls if c == name) - 1]
        return sample

    medians = interleaved_medians({name: sampler(name) for name in values}, rounds)
    assert medians == {"a": 2.0, "b": 5.0, "c": 7.0}
    chunks = [tuple(calls[i:i + 3]) for i in range(0, len(calls), 3)]
    assert all(sorted(chunk) == ["a", "b", "c"] for chunk in chunks)  # every sampler once a round
    assert len(set(chunks)) > 1  # the order changes between rounds
    assert {chunk[0] for chunk in chunks} != {"a"}  # not always the first sampler first


def test_seeded_order_repeats():
    def orders(seed):
        calls = []
        samplers = {n: (lambda n=n: calls.append(n) or 1.0) for n in "abcd"}
        interleaved_medians(samplers, 5, seed=seed)
        return calls

    assert orders(3) == orders(3)
