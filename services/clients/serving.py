"""The admin routes of the services that serve a model (the Coder, the Proposer): read what serves,
switch it to another version (an admin key)."""

from __future__ import annotations

from services.clients.base import ClientConfig, Flow, Send, ask, flow_method
from services.schemas.serving import ModelSwitch, ServingModel


class ModelServingRoutes(ClientConfig):
    @flow_method
    def serving_model(self) -> Flow[ServingModel]:
        response = yield from ask(Send("GET", "/v1/admin/model"))
        return ServingModel.model_validate(response.json())

    @flow_method
    def switch_model(self, switch: ModelSwitch) -> Flow[ServingModel]:
        response = yield from ask(Send("POST", "/v1/admin/model", json=switch.model_dump()))
        return ServingModel.model_validate(response.json())
