"""The operations, in layers (docs/broker_core.md "Modules and their layers"): router.py on top, the only
module that knows queues, topics and forwarding; forward.py delivers outboxes; queues.py, topics.py,
admin.py and transactions.py the operations by concern, siblings that never call each other; homes.py
(what works on any home: a queue or one subscription), advisory.py, virtual.py, flow.py what they build
on; context.py (key names, running a script, finishing a pass) at the bottom. A lower module asks for
upper or sibling work by yielding an effect (`Forward`, `Create`, `Settle`) that the router performs."""
