"""An agentless ML2 mechanism driver: every port is bound at once, on any segment.

On a production cloud an agent (OVS, OVN, Linux bridge) reports that it can wire a port
on the host, and only then does ML2 bind it; a port that no driver binds fails the
server's boot (binding_failed). Here no agent runs and Nova's fake driver plugs nothing,
so this driver binds every port the way an OVS agent would advertise it. Written rather
than Neutron's own test driver (neutron.tests.unit...), which is not part of the
package's supported surface and changes with its unit tests.
"""

from neutron_lib import constants
from neutron_lib.api.definitions import portbindings
from neutron_lib.plugins.ml2 import api


class BindEverything(api.MechanismDriver):
    def initialize(self):
        pass

    @property
    def connectivity(self):
        return portbindings.CONNECTIVITY_L2

    def bind_port(self, context):
        for segment in context.segments_to_bind:
            context.set_binding(
                segment[api.ID],
                portbindings.VIF_TYPE_OVS,
                {portbindings.CAP_PORT_FILTER: True, portbindings.OVS_HYBRID_PLUG: False},
                status=constants.PORT_STATUS_ACTIVE,
            )
            return
