"""Everything an operator can see and do, for the API, the CLI and the console alike.

One module per area, matching the API's routers: ``queues``, ``workers``,
``jobs``, ``delayed``, ``dlq``, ``schedules``, ``operations`` and ``audit``, plus
``api_keys`` (issued from the CLI, checked by the API's authentication).
``common`` holds what all of them use: the errors, the permission check, the
source and paging checks and the engine-errors adapter. ``background`` runs
the filtered replays and discards too big for one request; only ``dlq``
starts them and ``operations`` reports on them.

Each function takes the acting user and, for changes, where the change came
from (``source``: "api", "console" or "cli"). It checks the user's permission
(``PermissionDenied``), validates the input in words a person understands
(``InvalidInput``), refuses unknown queues and jobs (``NotFound``) and
conflicting requests (``Conflict``), does the work through the engine, and
records every change in the audit log with the number of entries it touched.
Callers only translate those four exceptions into their own idiom: an HTTP
status, a CLI error, a flash message.

``actor=None`` is the shell: a ``manage.py`` user already holds the keys to
the database and Redis, so the CLI runs unchecked when no ``--as`` user is
given (and is still audited, as "cli").

Callers import the module they need (``from chasqui_core.services import dlq
as dlq_service``); this package itself exports nothing, so importing one area
never loads the others.
"""
