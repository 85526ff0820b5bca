"""Console URLs, mounted at the site root."""

from django.urls import path, register_converter

from . import actions, batch_actions, login, views


class QueueName:
    regex = r"[A-Za-z0-9_.\-]{1,100}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class EntryId:
    """A dead-letter entry id: '<milliseconds>-<sequence>'."""

    regex = r"[0-9]{1,20}-[0-9]{1,20}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class WorkerId:
    """A worker's id as its heartbeat gives it (``<host>:<pid>:<random>`` unless the project named it)."""

    regex = r"[^/]{1,300}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(QueueName, "queue")
register_converter(WorkerId, "worker")
register_converter(EntryId, "entry")

app_name = "chasqui_console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", login.login, name="login"),
    path("logout/", login.logout, name="logout"),
    path("history/", views.overview_history, name="overview_history"),
    path("queues/<queue:name>/", views.queue, name="queue"),
    path("queues/<queue:name>/pause/", actions.pause, name="pause"),
    path("queues/<queue:name>/resume/", actions.resume, name="resume"),
    path("queues/<queue:name>/delayed/run/", actions.delayed_run, name="delayed_run"),
    path("queues/<queue:name>/delayed/cancel/", actions.delayed_cancel, name="delayed_cancel"),
    path("queues/<queue:name>/stream/", views.stream, name="stream"),
    path("queues/<queue:name>/history/", views.history, name="history"),
    path("queues/<queue:name>/purge/confirm/", actions.purge_confirm, name="purge_confirm"),
    path("queues/<queue:name>/purge/", actions.purge, name="purge"),
    path("queues/<queue:name>/dlq/", views.dlq, name="dlq"),
    path("queues/<queue:name>/dlq/confirm/", actions.confirm, name="confirm"),
    path("queues/<queue:name>/dlq/search/", views.dlq_search, name="dlq_search"),
    path("queues/<queue:name>/dlq/search/more/", views.dlq_search_more, name="dlq_search_more"),
    path("queues/<queue:name>/dlq/replay/", actions.bulk, {"action": "replay"}, name="replay"),
    path("queues/<queue:name>/dlq/discard/", actions.bulk, {"action": "discard"}, name="discard"),
    path("queues/<queue:name>/dlq/<entry:entry_id>/", views.entry, name="entry"),
    path("queues/<queue:name>/dlq/<entry:entry_id>/replay/", actions.entry_replay, name="entry_replay"),
    path("jobs/", views.search, name="search"),
    path("jobs/<path:job_id>/cancel/", actions.job_cancel, name="job_cancel"),  # before the job page: a path
    path("jobs/<path:job_id>/", views.job, name="job"),
    path("batches/<path:batch_id>/cancel/", actions.batch_cancel, name="batch_cancel"),  # before the page: a path
    path("batches/<path:batch_id>/replay-dead/", batch_actions.batch_replay_dead, name="batch_replay_dead"),
    path("batches/<path:batch_id>/", views.batch, name="batch"),
    path("operations/<uuid:op_id>/", views.operation, name="operation"),
    path("operations/<uuid:op_id>/cancel/", actions.operation_cancel, name="operation_cancel"),
    path("workers/", views.workers, name="workers"),
    path("workers/<worker:worker_id>/", views.worker, name="worker"),
    path("workers/<worker:worker_id>/quiet/", actions.worker_quiet, name="worker_quiet"),
    path("workers/<worker:worker_id>/stop/", actions.worker_stop, name="worker_stop"),
    path("audit/", views.audit, name="audit"),
    path("schedules/", views.schedules, name="schedules"),
    path("schedules/<queue:name>/pause/", actions.schedule_pause, name="schedule_pause"),
    path("schedules/<queue:name>/resume/", actions.schedule_resume, name="schedule_resume"),
    path("schedules/<queue:name>/run/", actions.schedule_run, name="schedule_run"),
    path("live/<path:topic>/", views.live, name="live"),
]
