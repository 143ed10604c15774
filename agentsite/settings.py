"""Settings for agentsite, read from the environment.

Every setting that an operator may change is read here through a small typed helper, and each
one is documented in the README.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    """On or off: 1/0, true/false, yes/no or on/off, in any case; empty or unset is `default`.
    Anything else is refused, so that a typo never turns a switch silently off."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is neither on nor off: use 1/0, true/false, yes/no or on/off."
    )


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number.") from None


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number.") from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return [part.strip() for part in value.split(",") if part.strip()]


def env_json_list(name: str, default: list[str]) -> list[str]:
    """A list given either as a JSON array (for items that contain commas) or comma-separated."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    if value.strip().startswith("["):
        return [str(item) for item in _env_json(name, value)]
    return env_list(name, default)


def env_mapping(name: str, default: dict[str, str]) -> dict[str, str]:
    """A mapping given either as a JSON object or as `name=value,name=value`."""
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    value = value.strip()
    if value.startswith("{"):
        parsed = _env_json(name, value)
        return {str(k): str(v) for k, v in parsed.items()}
    pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ImproperlyConfigured(
            f"{name} is neither `name=value,name=value` nor a JSON object: {value!r}"
        )
    return {k.strip(): v.strip() for k, v in pairs}


def env_agents(name: str, default: dict[str, str]) -> dict[str, str | dict[str, Any]]:
    """Agents by public name: `name=dotted.path,...`, or a JSON object whose values are dotted
    paths or objects such as `{"agent": "dotted.path", "model": "...", "model_settings": {...}}`
    (whose keys and values the registry checks at start: `engine.E002`)."""
    value = os.environ.get(name, "").strip()
    if not value.startswith("{"):
        return dict(env_mapping(name, default))
    parsed = _env_json(name, value)
    agents: dict[str, str | dict[str, Any]] = {}
    for key, spec in parsed.items():
        if not isinstance(spec, str | dict):
            raise ImproperlyConfigured(
                f"{name}[{key!r}] is neither a dotted path nor an object "
                f'{{"agent": "dotted.path", ...}}: {spec!r}'
            )
        agents[str(key)] = spec
    return agents


def _env_json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {error}") from None


DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DEBUG is off. A deployment's commands take it from "
            "its environment file: run them through deploy/manage (docs/deploy.md). "
            "For development, set DEBUG=1."
        )
    SECRET_KEY = "dev-only-insecure-key-never-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- Production security -------------------------------------------------------------------
# All off by default, so that `make run` serves plain http on 127.0.0.1; the README's
# "Production" paragraph lists what to turn on behind TLS (`manage.py check --deploy` is then
# clean).
# With DEBUG off the key signs sessions and saved run states: refuse one that Django's own
# check (security.W009) calls weak rather than run on it.
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY_MIN_UNIQUE_CHARACTERS = 5
SECRET_KEY_INSECURE_PREFIX = "django-insecure-"
if not DEBUG:
    if len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH:
        weakness = f"is shorter than {SECRET_KEY_MIN_LENGTH} characters"
    elif len(set(SECRET_KEY)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        weakness = f"has fewer than {SECRET_KEY_MIN_UNIQUE_CHARACTERS} different characters"
    elif SECRET_KEY.startswith(SECRET_KEY_INSECURE_PREFIX):
        weakness = f"starts with {SECRET_KEY_INSECURE_PREFIX!r}"
    else:
        weakness = ""
    if weakness:
        raise ImproperlyConfigured(
            f"SECRET_KEY {weakness}: with DEBUG off it must be a long random value, e.g. from "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
        )
# Redirect every http request to https.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Strict-Transport-Security: how long browsers only use https for this site (0: no header).
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Send the session and CSRF cookies over https only.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
# Behind a proxy that ends TLS: the header (as in request.META) and value that mark a request
# the proxy received over https, e.g. `HTTP_X_FORWARDED_PROTO,https`. Only set it when the
# proxy always sets (or strips) that header, or a client could claim https.
_proxy_ssl_header = env_list("SECURE_PROXY_SSL_HEADER", [])
if len(_proxy_ssl_header) not in (0, 2):
    raise ImproperlyConfigured(
        "SECURE_PROXY_SSL_HEADER is not a header and a value, like HTTP_X_FORWARDED_PROTO,https: "
        f"{os.environ['SECURE_PROXY_SSL_HEADER']!r}"
    )
SECURE_PROXY_SSL_HEADER: tuple[str, str] | None = (
    (_proxy_ssl_header[0], _proxy_ssl_header[1]) if _proxy_ssl_header else None
)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "conversations",
    "approvals",
    "tracing",
    "api",
    "ninja",  # the API's docs page, from django-ninja's vendored Swagger UI (no CDN)
    "engine",
    "webhooks",
    "notifications",
    "demo",
    "django_tasks_db",
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # No database connection in time (the pool is exhausted): 503 "busy, try again", not 500.
    "agentsite.db.pool.BusyMiddleware",
    # An API body beyond DATA_UPLOAD_MAX_MEMORY_SIZE: a JSON 413 with the limit, unread.
    "api.limits.body_limit",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # An htmx request whose session ended is sent to the login page as a whole page.
    "common.auth.htmx_login_redirect",
    # Last of those that act, as django-axes asks: it turns a locked-out login into the
    # lockout page.
    "axes.middleware.AxesMiddleware",
    # Sync only, so that Django runs the whole chain in one thread under ASGI instead of two
    # thread hops per middleware (agentsite/onethread.py).
    "agentsite.onethread.one_thread",
]

# One strict policy for every page, the admin's included, with DEBUG on or off: scripts and
# styles come from our own static files only (no inline <script>, style="", on*= or eval);
# the pages' websockets go to this same host, which 'self' covers.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}

ROOT_URLCONF = "agentsite.urls"

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
                "agentsite.context_processors.agentsite",
            ],
        },
    },
]

WSGI_APPLICATION = "agentsite.wsgi.application"
ASGI_APPLICATION = "agentsite.asgi.application"

# --- Database -------------------------------------------------------------------------------
# SQLite by default, tuned for a web app with a few concurrent writers: WAL so readers never
# wait for the writer, IMMEDIATE transactions so two writers queue at BEGIN instead of failing
# half-way with "database is locked", and a busy timeout so they queue rather than error.
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        # Persistent connections, checked before reuse: runs and sessions work in worker
        # threads that keep one connection each.
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
# On PostgreSQL each process keeps a bounded pool of connections (psycopg's pool, through
# Django): never more than DATABASE_POOL_MAX_SIZE, a thread that finds none free waits up to
# DATABASE_POOL_TIMEOUT seconds, then its request is answered 503 "busy, try again". All the
# processes' maximums together must fit the server's max_connections (the README's
# "connection budget"); agentsite/db/pool.py says how a process shares its pool.
DATABASE_POOL = env_bool("DATABASE_POOL", True)
DATABASE_POOL_MIN_SIZE = env_int("DATABASE_POOL_MIN_SIZE", 2)
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 10)
DATABASE_POOL_TIMEOUT = env_float("DATABASE_POOL_TIMEOUT", 10.0)
if DATABASE_POOL and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    if env_int("DATABASE_CONN_MAX_AGE", 0) != 0:
        raise ImproperlyConfigured(
            "DATABASE_CONN_MAX_AGE keeps connections per thread, which a pool does instead: "
            "unset it, or turn the pool off with DATABASE_POOL=0."
        )
    if not 0 <= DATABASE_POOL_MIN_SIZE <= DATABASE_POOL_MAX_SIZE or DATABASE_POOL_MAX_SIZE < 2:
        raise ImproperlyConfigured(
            f"DATABASE_POOL_MIN_SIZE={DATABASE_POOL_MIN_SIZE} and DATABASE_POOL_MAX_SIZE="
            f"{DATABASE_POOL_MAX_SIZE}: the maximum is at least 2 and the minimum at most it."
        )
    if DATABASE_POOL_TIMEOUT <= 0:
        raise ImproperlyConfigured(f"DATABASE_POOL_TIMEOUT={DATABASE_POOL_TIMEOUT} is not > 0.")
    # Django returns a pooled connection at close(), so connections are not kept (age 0).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    from agentsite.db import health

    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": DATABASE_POOL_MIN_SIZE,
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": DATABASE_POOL_TIMEOUT,
        # A connection is checked before it is handed out, at most once per 2 s (health.py).
        "check": health.check_connection,
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's backend with writers queued in the process and WAL checkpoints off the
    # request path: see agentsite/db/sqlite/base.py.
    DATABASES["default"]["ENGINE"] = "agentsite.db.sqlite"
    DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels ------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    # channels_redis' layer with time limits and fresh connections after an outage, whose
    # breaks pause the open sockets (see engine/layer.py).
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "engine.layer.ChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Auth, i18n, static --------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# axes' backend first: it refuses a locked-out login before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# WhiteNoise serves static files from the app server itself (no nginx needed), straight from
# the finders in DEBUG and from STATIC_ROOT (after `collectstatic`) otherwise.
WHITENOISE_USE_FINDERS = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- Login throttling ----------------------------------------------------------------------
# django-axes counts failed logins on /accounts/login/ and /admin/login/ in the database. Two
# separate locks: a username is locked after this many failures from any address (one user's
# password guessed from many addresses), and an address is locked after this many failures
# across any usernames (one address spraying a password over many users). A combined
# [username, address] lock would stop neither. A success resets no count (an attacker with an
# account of her own could otherwise wipe her address's count); failures age out instead.
AXES_FAILURE_LIMIT = env_int("AGENTSITE_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("AGENTSITE_LOGIN_COOLOFF_SECONDS", 15 * 60))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = False
AXES_LOCKOUT_CALLABLE = "common.auth.lockout_response"
# The address is REMOTE_ADDR (axes' default): behind a proxy every client shares the proxy's
# address, and a forwarded header is trusted only when configured (see the README).

# --- The agents ----------------------------------------------------------------------------
OPENAI_API_KEY = env_str("OPENAI_API_KEY")
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL")
# The model name sent to OpenAI or to the OpenAI-compatible endpoint, for every agent that
# names none of its own.
AGENTSITE_MODEL = env_str("AGENTSITE_MODEL", "gpt-4.1-mini")
# The SDK's name for the same thing. An agent that names no model gets the default settings of
# the SDK's default model (a gpt-5's reasoning effort and verbosity unless told), which other
# models and most compatible servers refuse. Agents take them when they are defined: set here.
os.environ["OPENAI_DEFAULT_MODEL"] = AGENTSITE_MODEL
# Which wire format the model is spoken to in: "auto" (the Responses API at OpenAI, Chat
# Completions at OPENAI_BASE_URL), "responses" or "chat_completions".
AGENTSITE_MODEL_API = env_str("AGENTSITE_MODEL_API", "auto").strip().lower()
if AGENTSITE_MODEL_API not in ("auto", "responses", "chat_completions"):
    raise ImproperlyConfigured(
        f"AGENTSITE_MODEL_API={AGENTSITE_MODEL_API!r}: choose auto, responses or chat_completions."
    )
# Retries of a model request that failed before its answer began (429 honouring retry-after,
# 5xx, a refused or dropped connection, a timeout), with the openai client's backoff.
AGENTSITE_MODEL_RETRIES = env_int("AGENTSITE_MODEL_RETRIES", 2)
# Seconds the model may stay silent (before its answer, or between two pieces of a stream)
# before the request is given up; connecting gets at most 10 of them.
AGENTSITE_MODEL_TIMEOUT = env_float("AGENTSITE_MODEL_TIMEOUT", 60.0)
if AGENTSITE_MODEL_RETRIES < 0 or AGENTSITE_MODEL_TIMEOUT <= 0:
    raise ImproperlyConfigured(
        "AGENTSITE_MODEL_RETRIES must be 0 or more and AGENTSITE_MODEL_TIMEOUT more than 0."
    )
# Ask an OpenAI-compatible server for usage in a stream's last chunk
# (stream_options.include_usage); turn off for a server that refuses the option.
AGENTSITE_MODEL_STREAM_USAGE = env_bool("AGENTSITE_MODEL_STREAM_USAGE", True)
# Upload traces to OpenAI's trace dashboard too, when OpenAI itself serves the model.
AGENTSITE_OPENAI_TRACE_EXPORT = env_bool("AGENTSITE_OPENAI_TRACE_EXPORT", True)
# Registered agents: public name -> dotted path of an `agents.Agent`, or an object naming it
# with its model and model settings (`engine/registry.py`). The first is the default.
AGENTSITE_AGENTS = env_agents("AGENTSITE_AGENTS", {"support": "demo.agents.support_desk"})

# The model that serves when neither OPENAI_API_KEY nor OPENAI_BASE_URL is set.
AGENTSITE_OFFLINE_MODEL = env_str("AGENTSITE_OFFLINE_MODEL", "demo.model.OfflineDemoModel")
# Seconds between the words the offline demo model streams (0: all at once).
AGENTSITE_DEMO_STREAM_DELAY = env_float("AGENTSITE_DEMO_STREAM_DELAY", 0.03)

# Encryption at rest for conversation items: a Fernet key (or another high-entropy secret).
AGENTSITE_SESSION_ENCRYPTION_KEY = env_str("AGENTSITE_SESSION_ENCRYPTION_KEY")
# How long an encrypted item stays readable, in seconds. 0 means no practical expiry: the
# SDK's own default of ten minutes would make chat history silently vanish.
AGENTSITE_SESSION_TTL = env_int("AGENTSITE_SESSION_TTL", 0)

# --- Runs and approvals --------------------------------------------------------------------
# How long an approval request waits before it expires and is rejected, in seconds.
AGENTSITE_APPROVAL_TTL = env_int("AGENTSITE_APPROVAL_TTL", 24 * 3600)
# What the model is told when a reviewer rejects a call without a message.
AGENTSITE_REJECTION_MESSAGE = env_str(
    "AGENTSITE_REJECTION_MESSAGE", "A reviewer rejected this tool call."
)
# Whether a reviewer may approve a call in a conversation she started herself (separation of
# duties: off, another reviewer must approve it; she may still reject it).
AGENTSITE_SELF_APPROVAL = env_bool("AGENTSITE_SELF_APPROVAL", False)
# Where runs execute: "inprocess" (an asyncio task in the server) or "tasks" (Django's tasks
# on the database backend, run by workers started with `manage.py run_worker`).
AGENTSITE_EXECUTOR = env_str("AGENTSITE_EXECUTOR", "inprocess")
# How many tasks (runs) one `manage.py run_worker` runs at once on its event loop. A run that
# waits for its model costs a worker about 0.35 MB and no thread; a turn about 50 ms of CPU:
# 50 runs on a model at 2 s a call keep about 60 % of the worker's one core busy.
AGENTSITE_WORKER_CONCURRENCY = env_int("AGENTSITE_WORKER_CONCURRENCY", 50)
# Per person: messages (runs started) in any minute, conversations opened in any hour (0: no
# limit). Beyond them the page answers 429 with a message; nothing is stored.
AGENTSITE_MESSAGES_PER_MINUTE = env_int("AGENTSITE_MESSAGES_PER_MINUTE", 10)
AGENTSITE_CONVERSATIONS_PER_HOUR = env_int("AGENTSITE_CONVERSATIONS_PER_HOUR", 30)
# On SIGTERM a server lets its in-flight runs end for this many seconds, then marks the rest
# interrupted (`python -m agentsite.serve`).
AGENTSITE_SHUTDOWN_GRACE = env_float("AGENTSITE_SHUTDOWN_GRACE", 10.0)
# A run still "running" after this many seconds without progress is taken as dead.
AGENTSITE_STUCK_RUN_TIMEOUT = env_int("AGENTSITE_STUCK_RUN_TIMEOUT", 15 * 60)
# How often the server expires overdue approvals and recovers stuck runs (0: never; then run
# `manage.py expire_approvals` and `manage.py recover_runs` from cron).
AGENTSITE_SWEEP_SECONDS = env_int("AGENTSITE_SWEEP_SECONDS", 60)
# Every server, worker and command process that runs agents beats this often (a row per
# process); a run names the process that owns it (0: no heartbeat, only the timeout above).
AGENTSITE_HEARTBEAT_SECONDS = env_float("AGENTSITE_HEARTBEAT_SECONDS", 5.0)
# A process silent this long is taken as gone: its running runs fail at once (3 beats).
AGENTSITE_PROCESS_TIMEOUT = env_float("AGENTSITE_PROCESS_TIMEOUT", 15.0)
if AGENTSITE_HEARTBEAT_SECONDS > 0 and AGENTSITE_PROCESS_TIMEOUT < 2 * AGENTSITE_HEARTBEAT_SECONDS:
    # Live processes would be taken as gone between two beats, and their runs failed.
    raise ImproperlyConfigured(
        f"AGENTSITE_PROCESS_TIMEOUT={AGENTSITE_PROCESS_TIMEOUT:g} must be at least two "
        f"heartbeats (AGENTSITE_HEARTBEAT_SECONDS={AGENTSITE_HEARTBEAT_SECONDS:g}); three or "
        "more is safer."
    )
# How long a run's final write (its completion, pause or failure) is retried while the
# database cannot be reached; then the run fails at its process's next heartbeat.
AGENTSITE_FINAL_WRITE_RETRY_SECONDS = env_float("AGENTSITE_FINAL_WRITE_RETRY_SECONDS", 30.0)
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

# --- Tracing -------------------------------------------------------------------------------
# Store every run's trace in the database (beside OpenAI's dashboard when OPENAI_API_KEY is set).
AGENTSITE_TRACING = env_bool("AGENTSITE_TRACING", True)
# Seconds between the trace processor's exports; spans reach the database this much later.
AGENTSITE_TRACE_BATCH_DELAY = env_float("AGENTSITE_TRACE_BATCH_DELAY", 1.0)
# Spans held in memory waiting for export; beyond this the SDK drops spans (and logs it).
AGENTSITE_TRACE_QUEUE_SIZE = env_int("AGENTSITE_TRACE_QUEUE_SIZE", 16384)
# Mask emails, phone numbers, card numbers, IBANs and secrets before anything is stored.
AGENTSITE_TRACE_REDACTION = env_bool("AGENTSITE_TRACE_REDACTION", True)
# More regexes to mask, comma-separated or a JSON list; each match becomes "[redacted]".
AGENTSITE_TRACE_REDACT_PATTERNS = env_json_list("AGENTSITE_TRACE_REDACT_PATTERNS", [])
# Record model and tool inputs and outputs in spans (the SDK's trace_include_sensitive_data).
AGENTSITE_TRACE_SENSITIVE_DATA = env_bool("AGENTSITE_TRACE_SENSITIVE_DATA", True)
# `manage.py prune_traces` deletes traces older than this many days.
AGENTSITE_TRACE_RETENTION_DAYS = env_int("AGENTSITE_TRACE_RETENTION_DAYS", 30)


def _otlp_endpoint(name: str, value: str) -> str:
    """An OTLP/HTTP traces URL, or empty (off). Refused at start-up unless http(s) with a
    host: a typo would otherwise lose every span, logged once."""
    value = value.strip()
    if not value:
        return ""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError for a port that is no number)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}={value!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not an http(s) URL with a host, such as "
            "http://127.0.0.1:4318/v1/traces."
        )
    return value


# Webhooks, the OpenTelemetry collector and every other outbound POST reach only public
# addresses, and these hosts (names, exact) or networks (`10.0.0.0/8`, `127.0.0.1`) even when
# they are private (common/destinations.py): a collector beside the site, say.
AGENTSITE_OUTBOUND_ALLOWED_HOSTS = env_list("AGENTSITE_OUTBOUND_ALLOWED_HOSTS", [])

# Forward every span (and each reviewer's decision) also to an OpenTelemetry collector, by
# OpenTelemetry's own OTLP/HTTP exporter, to this URL (the whole path:
# http://127.0.0.1:4318/v1/traces; Arize Phoenix's is http://host:6006/v1/traces); empty: off.
AGENTSITE_OTLP_ENDPOINT = _otlp_endpoint(
    "AGENTSITE_OTLP_ENDPOINT", env_str("AGENTSITE_OTLP_ENDPOINT")
)
# Headers sent with each request (`authorization=Bearer x,foo=bar`, or a JSON object).
AGENTSITE_OTLP_HEADERS = env_mapping("AGENTSITE_OTLP_HEADERS", {})
# How: "http/protobuf" (OpenTelemetry's default, what most receivers take) or "http/json".
AGENTSITE_OTLP_PROTOCOL = env_str("AGENTSITE_OTLP_PROTOCOL", "http/protobuf")
if AGENTSITE_OTLP_PROTOCOL not in ("http/protobuf", "http/json"):
    raise ImproperlyConfigured(
        f"AGENTSITE_OTLP_PROTOCOL={AGENTSITE_OTLP_PROTOCOL!r}: use http/protobuf or http/json."
    )
# The project the spans belong to: the resource's service.name and openinference.project.name
# (Phoenix's project), in the forwarding and the /traces/<id>.otlp.pb and .otlp.json downloads.
AGENTSITE_OTLP_SERVICE_NAME = env_str("AGENTSITE_OTLP_SERVICE_NAME", "agentsite")
# Seconds a batch may take to reach the collector, its retries (with backoff) included.
AGENTSITE_OTLP_TIMEOUT = env_float("AGENTSITE_OTLP_TIMEOUT", 10.0)
if AGENTSITE_OTLP_TIMEOUT <= 0:
    raise ImproperlyConfigured(f"AGENTSITE_OTLP_TIMEOUT={AGENTSITE_OTLP_TIMEOUT:g} is not > 0.")

# One handler, on the root logger: every app logger (and daphne's) propagates to it once.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # No line shows the model service's API key, even one that quotes a provider's error.
    "filters": {"api_key": {"()": "common.secrets.MaskApiKey"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["api_key"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's default config gives this logger a console handler of its own.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # OpenTelemetry's exporters log each failed request and retry; the site's forwarder
        # (tracing/forwarding.py) says the same once per burst, with the reason.
        "opentelemetry.exporter": {"level": "CRITICAL"},
    },
}

# --- Webhooks ------------------------------------------------------------------------------


def _webhook_step(name: str, value: str) -> float:
    try:
        step = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: {value!r} is not a number of seconds.") from None
    if step < 0:
        raise ImproperlyConfigured(f"{name}: {value!r} is below 0.")
    return step


# Endpoints are registered in admin (docs/webhooks.md). Seconds an attempt may take to connect,
# and to each read of the answer.
AGENTSITE_WEBHOOK_TIMEOUT = env_float("AGENTSITE_WEBHOOK_TIMEOUT", 5.0)
# Attempts of one delivery (the first and its retries) before it is recorded failed.
AGENTSITE_WEBHOOK_MAX_ATTEMPTS = env_int("AGENTSITE_WEBHOOK_MAX_ATTEMPTS", 6)
# The waits before each retry, in seconds (the last one repeats), each ±20 %.
AGENTSITE_WEBHOOK_BACKOFF_SECONDS = [
    _webhook_step("AGENTSITE_WEBHOOK_BACKOFF_SECONDS", step)
    for step in env_list("AGENTSITE_WEBHOOK_BACKOFF_SECONDS", ["10", "60", "300", "1800", "7200"])
]
# Attempts a process sends at once (at most half of them to one endpoint).
AGENTSITE_WEBHOOK_CONCURRENCY = env_int("AGENTSITE_WEBHOOK_CONCURRENCY", 4)
# With AGENTSITE_EXECUTOR=inprocess, the web server looks for due deliveries this often (it is
# also woken when one is queued); 0 turns its timer off (then cron `deliver_webhooks`).
AGENTSITE_WEBHOOK_POLL_SECONDS = env_float("AGENTSITE_WEBHOOK_POLL_SECONDS", 5.0)
# The site's address as receivers reach it, for the links in payloads
# (`https://agents.example.com`); empty: links are paths.
AGENTSITE_WEBHOOK_SITE_URL = env_str("AGENTSITE_WEBHOOK_SITE_URL")
# After a secret is rotated, deliveries are signed with the previous one too for this many
# seconds (the new first), so a receiver can be moved to the new one without losing any.
AGENTSITE_WEBHOOK_ROTATION_OVERLAP = env_int("AGENTSITE_WEBHOOK_ROTATION_OVERLAP", 86400)
if AGENTSITE_WEBHOOK_ROTATION_OVERLAP < 0:
    raise ImproperlyConfigured("AGENTSITE_WEBHOOK_ROTATION_OVERLAP is below 0.")

# --- Expiry policies ------------------------------------------------------------------------
# A request whose expiry policy escalates it (`registry.review(..., on_expiry="escalate")` or
# an approval policy's rule) waits this many seconds more, once, from when it is escalated.
AGENTSITE_ESCALATION_SECONDS = env_int("AGENTSITE_ESCALATION_SECONDS", AGENTSITE_APPROVAL_TTL)
# This long before a request's deadline, `approval_reminder` is sent once for it (email
# notifications remind the reviewers who opted in); 0: no reminders. Default: a tenth of the
# TTL, at most an hour.
AGENTSITE_APPROVAL_REMINDER_SECONDS = env_int(
    "AGENTSITE_APPROVAL_REMINDER_SECONDS", min(3600, AGENTSITE_APPROVAL_TTL // 10)
)

# --- Email notifications -------------------------------------------------------------------
# Reviewers choose in /account/notifications/ (docs/notifications.md). Mail goes through
# Django's email framework, as Django 6.1 configures it (MAILERS; its EMAIL_* settings are
# deprecated): printed on the console until EMAIL_HOST names an SMTP server.
_email_host = env_str("EMAIL_HOST")
# STARTTLS (port 587); EMAIL_USE_SSL for implicit TLS (port 465). Not both.
_email_use_tls = env_bool("EMAIL_USE_TLS", True)
_email_use_ssl = env_bool("EMAIL_USE_SSL", False)
if _email_use_tls and _email_use_ssl:
    raise ImproperlyConfigured(
        "EMAIL_USE_TLS and EMAIL_USE_SSL are both on: choose one (TLS for 587, SSL for 465)."
    )
# Seconds the SMTP server may take to connect and to answer each command.
EMAIL_SEND_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0)
_mailer: dict[str, Any] = {
    "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
    "OPTIONS": {
        "host": _email_host,
        "port": env_int("EMAIL_PORT", 587),
        "username": env_str("EMAIL_HOST_USER"),
        "password": env_str("EMAIL_HOST_PASSWORD"),
        "use_tls": _email_use_tls,
        "use_ssl": _email_use_ssl,
        "timeout": EMAIL_SEND_TIMEOUT,
    },
}
if not _email_host:
    # Development prints each email readably, its link whole (notifications/console.py); with
    # DEBUG off it is Django's own console backend, which its deployment check refuses by name.
    _console = "notifications.console" if DEBUG else "django.core.mail.backends.console"
    _mailer = {"BACKEND": f"{_console}.EmailBackend"}
MAILERS: dict[str, dict[str, Any]] = {"default": _mailer}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "agentsite <agentsite@localhost>")
# The site's address as reviewers reach it, for the links in emails (they must be absolute).
# Unset: AGENTSITE_WEBHOOK_SITE_URL; else the address the server listens on (agentsite/serve.py
# sets it before this is read); else, where it cannot tell (a worker, cron, behind a proxy),
# `make run`'s default address.
AGENTSITE_EMAIL_SITE_URL = (
    env_str("AGENTSITE_EMAIL_SITE_URL") or AGENTSITE_WEBHOOK_SITE_URL or "http://127.0.0.1:8000"
)
# How long an email's link to its request opens the page (it never decides anything).
AGENTSITE_EMAIL_LINK_SECONDS = env_int("AGENTSITE_EMAIL_LINK_SECONDS", 24 * 3600)
# Attempts of one email before its notifications are recorded failed, and the waits between.
AGENTSITE_EMAIL_MAX_ATTEMPTS = env_int("AGENTSITE_EMAIL_MAX_ATTEMPTS", 5)
AGENTSITE_EMAIL_BACKOFF_SECONDS = [
    _webhook_step("AGENTSITE_EMAIL_BACKOFF_SECONDS", step)
    for step in env_list("AGENTSITE_EMAIL_BACKOFF_SECONDS", ["30", "120", "600", "1800"])
]
# With AGENTSITE_EXECUTOR=inprocess, the web server looks for due emails this often (digests
# fall due on it; it is also woken as one is queued); 0: off, run `send_notifications` by cron.
AGENTSITE_EMAIL_POLL_SECONDS = env_float("AGENTSITE_EMAIL_POLL_SECONDS", 30.0)
