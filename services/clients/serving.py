"""The admin routes of the services that serve a model (the Coder, the Proposer): read what serves,
switch it to another version (an admin key)."""

from __future__ import annotations

from services.clients.base import ServiceClient
from services.schemas.serving import ModelSwitch, ServingModel


class ModelServingClient(ServiceClient):
    def serving_model(self) -> ServingModel:
        return ServingModel.model_validate(self.request("GET", "/v1/admin/model").json())

    def switch_model(self, switch: ModelSwitch) -> ServingModel:
        return ServingModel.model_validate(self.request("POST", "/v1/admin/model", json=switch.model_dump()).json())
