"""The shared platform layer: settings, database, queues, schemas, auth, clients, sandbox, CLI."""
