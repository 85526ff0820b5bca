"""Django settings for the Chasqui project.

Everything that differs between a laptop, CI and production comes from
environment variables (see README.md, "Configuration"). The defaults are the
ones ``make run`` needs: DEBUG on, SQLite under ``var/``, and an embedded Valkey
server when ``REDIS_URL`` is unset.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_int, env_list, env_str, smtp_mailer

BASE_DIR = Path(__file__).resolve().parent.parent

# Local state (SQLite database, embedded Valkey data, generated admin password).
# The folder is git-ignored.
VAR_DIR = BASE_DIR / "var"

DEBUG = env_bool("DEBUG", True)

_INSECURE_DEV_SECRET_KEY = "django-insecure-chasqui-dev-only-do-not-use-in-production"
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off: the development key is public."
        )
    SECRET_KEY = _INSECURE_DEV_SECRET_KEY

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")

# HTTPS=true: the site is served over HTTPS only (what `manage.py check --deploy` asks of a production site):
# plain HTTP is redirected, cookies are sent over HTTPS only, and browsers are told to use nothing else for
# HSTS_SECONDS (a year by default; this cannot be taken back from browsers that saw it before it expires).
HTTPS = env_bool("HTTPS", False)
if HTTPS:
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("HSTS_PRELOAD", True)
    if env_list("CHASQUI_TRUSTED_PROXIES"):
        # TLS ends at the trusted proxy, which says so: else every request would be redirected forever.
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Unset means "no external server": the run command starts an embedded Valkey
# and passes its URL to the processes it spawns in their REDIS_URL, so every
# process that reads these settings sees the real URL. settings.REDIS_URL is
# defined only when the variable holds a URL: Chasqui reports an empty one
# (chasqui.E003) rather than quietly using 127.0.0.1.
_redis_url = env_str("REDIS_URL")
if _redis_url:
    REDIS_URL = _redis_url

INSTALLED_APPS = [
    # First on purpose: Django gives management commands of earlier apps
    # priority, and our `runworker` must win over the one Channels ships.
    "chasqui_core.apps.ChasquiCoreConfig",
    # Daphne before staticfiles so its ASGI `runserver` replaces Django's.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",  # limits password guessing at the console's login
    "dashboard",
    "api",
    "emails",
    "config",  # the demo project's own commands (make run's devstack, ensure_admin): not in the package
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a locked-out login into its 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "emails.context_processors.signup_demo",
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

# Database: DATABASE_URL (e.g. postgres://user:pass@host:5432/name), else SQLite
# in var/. The folder is created here because SQLite will not create it.
_DEFAULT_SQLITE = VAR_DIR / "db.sqlite3"
if not os.environ.get("DATABASE_URL"):
    VAR_DIR.mkdir(parents=True, exist_ok=True)
DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{_DEFAULT_SQLITE}",
    ),
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Tests start real worker processes, which must see the test database:
    # a file, not SQLite's default in-memory test database. Workers share it
    # with the web process, so wait for locks rather than fail at once.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # One file per test run, so two runs side by side do not share it.
    DATABASES["default"].setdefault("TEST", {})["NAME"] = str(VAR_DIR / f"test-db-{os.getpid()}.sqlite3")
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("timeout", 20)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Channels: Redis when we know its URL; in-memory otherwise, which is enough
# for management commands that never touch websockets. The layer is
# channels_redis's, the kind the server allows (pub/sub on a Redis Cluster):
# see chasqui_core/channel_layer.py.
if _redis_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chasqui_core.channel_layer.redis_channel_layer",
            "CONFIG": {"hosts": [_redis_url]},
        },
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Django's task framework, executed by Chasqui.
TASKS = {
    "default": {
        "BACKEND": "chasqui_core.backend.ChasquiBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {},
    },
}

# The console: seconds between two reads of Redis by the live sampler (one
# per server process), which pushes fresh numbers to every open console tab.
CHASQUI_SAMPLER_INTERVAL = 1.0

# Engine settings (stream names, timeouts, retry policy...). The engine reads
# this dict and documents its keys; empty means "engine defaults".
CHASQUI: dict[str, object] = {}
# Keys that sign jobs, the signing one first (see docs/security.md).
if env_list("CHASQUI_SIGNING_KEYS"):
    CHASQUI["SIGNING_KEYS"] = env_list("CHASQUI_SIGNING_KEYS")
# Reverse proxies whose X-Forwarded-For names the client (docs/settings.md).
if env_list("CHASQUI_TRUSTED_PROXIES"):
    CHASQUI["TRUSTED_PROXIES"] = env_list("CHASQUI_TRUSTED_PROXIES")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# Password guessing at the login form: after AXES_FAILURE_LIMIT wrong passwords
# for one username from one address, or from one address whatever the
# username, that address waits AXES_COOLOFF_TIME (answered 429). Never by
# username alone: an attacker could otherwise lock the admin out from
# everywhere. A successful login resets the count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 10
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

# Wrong API keys: after API_KEY_FAILURE_LIMIT wrong bearer keys from one
# address with one key prefix within API_KEY_FAILURE_WINDOW seconds, further
# wrong ones get 429 with Retry-After until the window passes; a right key is
# always served. Counted in Redis, shared by every web process.
API_KEY_FAILURE_LIMIT = 20
API_KEY_FAILURE_WINDOW = 300
# Django's Redis cache, on a cluster or behind Sentinel too (chasqui_core/cache.py).
if _redis_url:
    CACHES = {"default": {"BACKEND": "chasqui_core.cache.RedisCache", "LOCATION": _redis_url,
                          "KEY_PREFIX": "chasqui-web"}}

# The demo's signup form (it enqueues work): on in `make run` (devstack sets
# CHASQUI_DEMO=1), otherwise only for logged-in users allowed to enqueue jobs.
CHASQUI_DEMO = env_bool("CHASQUI_DEMO", False)
if CHASQUI_DEMO:  # something on the console's Schedules page (docs/schedules.md)
    CHASQUI["SCHEDULES"] = {"signup-digest": {"task": "emails.tasks.signup_digest", "every": 60}}

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# The demo "sends" email to the console of the worker that runs the task, unless SMTP_URL names a server:
# smtp://user:password@host:587 (STARTTLS), smtps://...:465 (TLS from the start), smtp+plain://host:25.
# (MAILERS replaces the EMAIL_BACKEND setting deprecated in Django 6.1.)
MAILERS = {"default": smtp_mailer(env_str("SMTP_URL"))} if env_str("SMTP_URL") else {
    "default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"},
}
DEFAULT_FROM_EMAIL = "Chasqui <noreply@chasqui.localhost>"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "chasqui": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Replaces Django's default "django" handler, which would print each
        # record a second time, unformatted, next to the root handler's copy.
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Django logs every task run at INFO (started, finished): two lines per
        # job, which would cost a busy worker most of its throughput. Failures
        # for good still log at ERROR; chasqui.worker logs retries and dead
        # letters. Set this to INFO to see every job.
        "django.tasks": {"level": "WARNING"},
    },
}
