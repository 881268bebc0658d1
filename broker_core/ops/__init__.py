"""The operations, in layers (docs/broker_core.md "Modules and their layers"): router.py on top, the only
module that knows queues, topics and forwarding; forward.py delivers outboxes; transactions.py, topics.py,
queues.py and admin.py the operations by concern; advisory.py, virtual.py, flow.py what they build on;
context.py (key names, running a script, finishing a pass) at the bottom. A lower module asks for upper
work by yielding an effect (`Forward`, `Create`) that the router performs."""
