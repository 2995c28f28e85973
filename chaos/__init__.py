"""The chaos lab: local cluster supervisor, fault relay, experiments and their runner, rmq-admin, and the
rmqlab pytest plugin."""
