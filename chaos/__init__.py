"""The chaos lab: local cluster supervisor, fault proxy, experiments and their runner, rmq-admin, and the
rmqlab pytest plugin."""
