"""favor's thread count follows torch.get_num_threads() unless the user set favor's
(favor.set_num_threads or FAVOR_NUM_THREADS). Process-global state: each case runs in a
fresh interpreter. (That following avoids oversubscription is measured by favor.bench.)"""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, favor, favor.torch as ft
    q = torch.randn(1, 2, 8, 4)
    def after(n):
        torch.set_num_threads(n)
        ft.attention(q, q, q, features=8)
        return favor.num_threads()
    print("follow", after(1), after(2), after(3))
    favor.set_num_threads(2)
    print("user", after(1), after(3))
""")


def _run(env_extra):
    env = dict(os.environ)
    env.pop("FAVOR_NUM_THREADS", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return dict((line.split()[0], line.split()[1:]) for line in out.stdout.splitlines())


def test_favor_follows_torch_threads_until_the_user_sets_them():
    lines = _run({})
    assert lines["follow"] == ["1", "2", "3"]
    assert lines["user"] == ["2", "2"]


def test_favor_num_threads_environment_variable_wins():
    lines = _run({"FAVOR_NUM_THREADS": "1"})
    assert lines["follow"] == ["1", "1", "1"]
