"""Objects the BLS hands to the python-backend stub are released by Python, after the stub is done with them."""

import gc
import weakref

from tritontts.triton.stub_objects import Holder


class Thing:
    pass


def test_an_object_lives_until_a_later_hold_finds_it_expired():
    now = [0.0]
    holder = Holder(hold_s=20.0, clock=lambda: now[0])
    first = Thing()
    ref = weakref.ref(first)
    holder.hold(first)
    del first
    now[0] = 19.0
    holder.hold(Thing())
    gc.collect()
    assert ref() is not None and len(holder) == 2
    now[0] = 20.5
    holder.hold(Thing())
    gc.collect()
    assert ref() is None and len(holder) == 2


def test_holds_keep_their_order_and_release_only_the_expired():
    now = [0.0]
    holder = Holder(hold_s=5.0, clock=lambda: now[0])
    refs = []
    for t in range(10):
        now[0] = float(t)
        thing = Thing()
        refs.append(weakref.ref(thing))
        holder.hold(thing)
        del thing
    gc.collect()
    assert [r() is None for r in refs] == [True] * 4 + [False] * 6
