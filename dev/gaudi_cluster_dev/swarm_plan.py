"""The seats a master expects from a swarm (`swarm`): who every simulated rank claims to be and
where it connects from. No import of gaudi_cluster: a master of any version can read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SwarmPlan:
    """The seats a master expects from a swarm of `nodes` x `per_node` ranks."""

    nodes: int
    per_node: int = 8

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    def node(self, i: int) -> str:
        return f"swarm-node-{i}"

    def host(self, i: int) -> str:
        return f"swarm-host-{i}"

    def address(self, i: int) -> str:
        return f"127.1.{i // 250}.{i % 250 + 1}"

    def expected(self) -> dict[int, str]:
        return {rank: self.host(rank // self.per_node) for rank in range(self.ranks)}

    def rank_nodes(self) -> dict[int, str]:
        return {rank: self.node(rank // self.per_node) for rank in range(self.ranks)}

    def addresses(self) -> dict[str, set[str]]:
        return {self.node(i): {self.address(i)} for i in range(self.nodes)}

    def slots_by_host(self) -> dict[str, int]:
        return {self.host(i): self.per_node for i in range(self.nodes)}
