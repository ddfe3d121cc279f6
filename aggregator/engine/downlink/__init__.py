"""The downlink of one job: what a new version broadcasts (:mod:`.broadcast`), the messages
the service publishes (:mod:`.outbound`), and what each agent's downlink carried and when it
is free again (:mod:`.pacing`)."""
