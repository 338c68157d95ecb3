"""The three code examples of the engine contract (shared/seed/000_*.txt), verbatim.

Each example is copied character for character into its own test, so a change to
the engine that breaks the documented behaviour breaks one of these.
"""


def test_seed_example_backward_accumulates_and_seed_gradient():
    import numpy as np

    from glassllm import Tensor

    x = Tensor([3.0], requires_grad=True)
    y = x * x + x
    y.backward()
    np.testing.assert_allclose(x.grad, [7.0])
    y.backward()
    np.testing.assert_allclose(x.grad, [14.0])
    x.grad = None
    y.backward(np.array([2.0]))
    np.testing.assert_allclose(x.grad, [14.0])


def test_seed_example_broadcasting_and_max_ties():
    import numpy as np

    from glassllm import Tensor

    x = Tensor(np.ones((2, 3)), requires_grad=True)
    bias = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x + bias).sum().backward()
    np.testing.assert_allclose(bias.grad, [2.0, 2.0, 2.0])
    np.testing.assert_allclose(x.grad, np.ones((2, 3)))
    ties = Tensor([2.0, 2.0, 1.0], requires_grad=True)
    ties.max().backward()
    np.testing.assert_allclose(ties.grad, [0.5, 0.5, 0.0])


def test_seed_example_no_grad():
    from glassllm import Tensor, no_grad

    x = Tensor([3.0], requires_grad=True)
    with no_grad():
        y = x * 2
        assert not y.requires_grad
        y.backward()
    assert x.grad is None
    assert (x * 2).requires_grad
