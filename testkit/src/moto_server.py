"""Keelson's moto server: `python -c <this> -H HOST -p PORT`, i.e. `moto.server` with the fixes below,
each where moto differs from AWS's documented behaviour. Tests that need a fix assert it, so each one
has a test that fails without it.

1. Instances launched from a launch template carry the template's IAM instance profile.
   AWS: RunInstances with a LaunchTemplate (and every Auto Scaling launch from one) gives the instance
   the template's `IamInstanceProfile` (DescribeInstances shows `IamInstanceProfile.Arn`). moto drops
   it, so instances show none. Test: protokube/tests/node_join.rs
   `moto_instances_of_a_launch_template_carry_its_instance_profile` (the node-join server checks
   that a joining instance carries its group's profile).

2. A launch-template version created by CreateLaunchTemplateVersion keeps its `UserData` as moto's
   base64 type. AWS: every version of a template may carry user-data and an Auto Scaling group launches
   from whichever version it is configured with. moto 5.x wraps `UserData` only in CreateLaunchTemplate,
   so version 2 and later hold a plain string and every launch from them fails moto's own type check
   (an autoscaling group pinned to version 2 never gets an instance). Test:
   ops/tests/rolling_moto.rs `moto_launches_from_a_launch_template_version_with_user_data`.

3. A route whose target instance is gone is a blackhole. AWS: a route table entry whose target
   instance has stopped or terminated reports `State: blackhole` (DescribeRouteTables); the AWS
   cloud-controller-manager's route controller deletes blackhole routes and otherwise looks up the
   Node of every instance a route points at. moto reports every route `active`, so after a node is
   replaced the controller fails on the dead instance ("node with instanceID … not found") and never
   writes the new nodes' pod-CIDR routes. Test: tests/tests/moto_routes.rs
   `a_route_to_a_terminated_instance_is_a_blackhole`.

4. An Auto Scaling group registers an instance in its target groups once, when the instance enters
   service (or when the target group is attached), and detaching a target group deregisters only the
   instances still registered. AWS: the group adds a *new* instance to its target groups; a target
   deregistered since (by DeregisterTargets: Keelson's protokube takes its control plane out of the API
   target group until the local API server is ready) stays out when the group launches or terminates
   another instance. moto re-registers every instance of the group on every change of the group, so a
   control plane that took itself out is put back behind the load balancer by its neighbour's
   replacement, and DetachLoadBalancerTargetGroups fails (InvalidTarget) on a target already gone.
   Test: tests/tests/moto_target_groups.rs `an_instance_out_of_its_target_group_stays_out`.
"""
import sys

from moto.autoscaling.models import AutoScalingBackend
from moto.core.types import Base64EncodedString
from moto.ec2.models.instances import InstanceBackend
from moto.ec2.models.launch_templates import LaunchTemplate
from moto.ec2.models.route_tables import Route
from moto.ec2.utils import parse_user_data

_run_instances = InstanceBackend.run_instances


def _run_instances_with_template_profile(self, image_id, count, user_data, security_group_names, **kwargs):
    reservation = _run_instances(self, image_id, count, user_data, security_group_names, **kwargs)
    template = kwargs.get("launch_template")
    explicit = kwargs.get("iam_instance_profile_name") or kwargs.get("iam_instance_profile_arn")
    if template and not explicit:
        profile = self._get_template_from_args(template).data.get("IamInstanceProfile") or {}
        name, arn = profile.get("Name"), profile.get("Arn")
        if name or arn:
            for instance in reservation.instances:
                if instance.id not in self.iam_instance_profile_associations:
                    self.associate_iam_instance_profile(
                        instance_id=instance.id, iam_instance_profile_name=name, iam_instance_profile_arn=arn
                    )
    return reservation


InstanceBackend.run_instances = _run_instances_with_template_profile

_create_version = LaunchTemplate.create_version


def _create_version_with_user_data(self, data, description):
    user_data = data.get("UserData")
    if user_data is not None and not isinstance(user_data, Base64EncodedString):
        data = dict(data, UserData=parse_user_data(user_data))
    return _create_version(self, data, description)


LaunchTemplate.create_version = _create_version_with_user_data


def _route_state(self):
    instance = self.instance
    if instance is not None and instance.state in ("stopped", "terminated", "shutting-down", "stopping"):
        return "blackhole"
    return "active"


Route.state = property(_route_state)



def _register_new_instances(self, group_name):
    group = self.autoscaling_groups[group_name]
    if not group.target_group_arns:
        return
    done = getattr(group, "keelson_registered", set())
    ids = {state.instance.id for state in group.instance_states}
    for tg in self.elbv2_backend.describe_target_groups(target_group_arns=group.target_group_arns, load_balancer_arn=None, names=None):
        new = sorted(i for i in ids if (tg.arn, i) not in done)
        if new:
            self.elbv2_backend.register_targets(tg.arn, [{"Id": i, "Port": tg.port} for i in new])
        done = {(arn, i) for (arn, i) in done if arn != tg.arn or i in ids} | {(tg.arn, i) for i in ids}
    group.keelson_registered = done


def _detach_target_groups(self, group_name, target_group_arns):
    group = self.autoscaling_groups[group_name]
    group.target_group_arns = [x for x in group.target_group_arns if x not in target_group_arns]
    ids = {state.instance.id for state in group.instance_states}
    for arn in target_group_arns:
        tg = self.elbv2_backend.target_groups.get(arn)
        registered = [{"Id": i} for i in ids if tg is not None and i in tg.targets]
        if registered:
            self.elbv2_backend.deregister_targets(arn, registered)
    group.keelson_registered = {(a, i) for (a, i) in getattr(group, "keelson_registered", set()) if a not in target_group_arns}


AutoScalingBackend.update_attached_target_groups = _register_new_instances
AutoScalingBackend.detach_load_balancer_target_groups = _detach_target_groups

if __name__ == "__main__":
    from moto.server import main

    sys.argv[0] = "moto_server"
    main(sys.argv[1:])
