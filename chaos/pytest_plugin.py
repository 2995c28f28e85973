"""pytest plugin: fixtures that start a broker and consumer groups for users' own tests."""
