"""Claims of the test provider: e-mail, preferred_username, and the user's Django groups as "groups"."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsClaimValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim, whatever the scopes ("groups" is in no standard scope)

    def get_additional_claims(self, request):
        user = request.user
        return {"email": user.email, "preferred_username": user.username,
                "groups": sorted(user.groups.values_list("name", flat=True))}
