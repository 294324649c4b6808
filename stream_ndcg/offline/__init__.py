"""The batch twins of the service: the replay over files of events (`replay`) and the dashboard's
history (`history`)."""
