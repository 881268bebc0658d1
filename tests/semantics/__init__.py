"""broker_core against ActiveMQ's semantics, one folder per section of shared/spec/activemq-semantics.md
(sNN_ = section NN). tests/README.md maps each section to its folder and files."""
