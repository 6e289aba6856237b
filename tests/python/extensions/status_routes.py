"""A route extension written for Dynamo 1.6.1: two static GET routes, one answering with an
explicit status, importing the types from `dynamo.llm` as Dynamo's documentation shows."""
from dynamo.llm import FrontendExtensionContext, FrontendResponse, FrontendRoute


def status(ctx: FrontendExtensionContext):
    return {
        "ready": ctx.is_ready(),
        "cancelled": ctx.is_cancelled(),
        "any_ready": ctx.has_any_ready_model(),
        "tiny_ready": ctx.is_model_ready_to_serve("tiny"),
        "other_ready": ctx.is_model_ready_to_serve("other"),
        "models": ctx.model_display_names(),
        "serving": ctx.serving_ready_display_names(),
    }


def teapot(ctx: FrontendExtensionContext):
    return FrontendResponse(418, {"error": "I'm a teapot", "ready": ctx.is_ready()})


def routes():
    return [FrontendRoute("GET", "/ext/status", status), FrontendRoute("GET", "/ext/teapot", teapot)]
